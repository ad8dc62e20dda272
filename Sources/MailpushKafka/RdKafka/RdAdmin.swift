import CRdKafka

/// librdkafka's admin calls (CreateTopics, DescribeConfigs) on the metadata client's handle. Each call sends
/// one request and blocks on a queue of its own until the result event arrives or the timeout passes.
extension RdMetadataClient {
    func createTopics(_ topics: [NewTopic], timeoutMs: Int32) throws(KafkaError) -> AdminAnswer<[String: TopicCreation]> {
        if topics.isEmpty { return .answered([:]) }
        var handles: [OpaquePointer?] = []
        defer { handles.withUnsafeMutableBufferPointer { rd_kafka_NewTopic_destroy_array($0.baseAddress, $0.count) } }
        for topic in topics {
            var errstr = [CChar](repeating: 0, count: 512)
            guard
                let handle = rd_kafka_NewTopic_new(
                    topic.name, Int32(topic.partitions), Int32(topic.replicationFactor), &errstr, errstr.count)
            else { throw .invalidArgument("topic \(topic.name): \(rdString(errstr))") }
            handles.append(handle)
            for (key, value) in topic.configs.sorted(by: { $0.key < $1.key }) {
                let code = rd_kafka_NewTopic_set_config(handle, key, value)
                guard code == RD_KAFKA_RESP_ERR_NO_ERROR else {
                    throw KafkaError(rd: code, message: "topic \(topic.name): config \(key)=\(value) refused")
                }
            }
        }
        return try request(RD_KAFKA_ADMIN_OP_CREATETOPICS, timeoutMs: timeoutMs) { options, queue in
            handles.withUnsafeMutableBufferPointer { rd_kafka_CreateTopics(client.rk, $0.baseAddress, $0.count, options, queue) }
        } read: { event in
            guard let result = rd_kafka_event_CreateTopics_result(event) else { return [:] }
            var count = 0
            guard let entries = rd_kafka_CreateTopics_result_topics(result, &count) else { return [:] }
            var outcomes: [String: TopicCreation] = [:]
            for entry in UnsafeBufferPointer(start: entries, count: count) {
                guard let entry else { continue }
                let name = String(cString: rd_kafka_topic_result_name(entry))
                let code = rd_kafka_topic_result_error(entry)
                switch code {
                case RD_KAFKA_RESP_ERR_NO_ERROR: outcomes[name] = .created
                case RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS: outcomes[name] = .alreadyExists
                default:
                    let text = rd_kafka_topic_result_error_string(entry).map { String(cString: $0) }
                    outcomes[name] = .failed(KafkaError(rd: code, message: text))
                }
            }
            return outcomes
        }
    }

    func describeTopicConfigs(_ topics: [String], timeoutMs: Int32) throws(KafkaError) -> AdminAnswer<[String: [String: String]]> {
        if topics.isEmpty { return .answered([:]) }
        var handles: [OpaquePointer?] = topics.map { rd_kafka_ConfigResource_new(RD_KAFKA_RESOURCE_TOPIC, $0) }
        defer { handles.withUnsafeMutableBufferPointer { rd_kafka_ConfigResource_destroy_array($0.baseAddress, $0.count) } }
        var failure: KafkaError?
        let answer = try request(RD_KAFKA_ADMIN_OP_DESCRIBECONFIGS, timeoutMs: timeoutMs) { options, queue in
            handles.withUnsafeMutableBufferPointer { rd_kafka_DescribeConfigs(client.rk, $0.baseAddress, $0.count, options, queue) }
        } read: { event -> [String: [String: String]] in
            guard let result = rd_kafka_event_DescribeConfigs_result(event) else { return [:] }
            var count = 0
            guard let resources = rd_kafka_DescribeConfigs_result_resources(result, &count) else { return [:] }
            var configs: [String: [String: String]] = [:]
            for resource in UnsafeBufferPointer(start: resources, count: count) {
                guard let resource else { continue }
                let name = String(cString: rd_kafka_ConfigResource_name(resource))
                let code = rd_kafka_ConfigResource_error(resource)
                guard code == RD_KAFKA_RESP_ERR_NO_ERROR else {
                    let text =
                        rd_kafka_ConfigResource_error_string(resource).map { String(cString: $0) }
                        ?? String(cString: rd_kafka_err2str(code))
                    failure = failure ?? KafkaError(rd: code, message: "DescribeConfigs \(name): \(text)")
                    continue
                }
                var entryCount = 0
                var values: [String: String] = [:]
                if let entries = rd_kafka_ConfigResource_configs(resource, &entryCount) {
                    for entry in UnsafeBufferPointer(start: entries, count: entryCount) {
                        // A sensitive entry's value is null: it is left out rather than guessed.
                        guard let entry, let value = rd_kafka_ConfigEntry_value(entry) else { continue }
                        values[String(cString: rd_kafka_ConfigEntry_name(entry))] = String(cString: value)
                    }
                }
                configs[name] = values
            }
            return configs
        }
        if let failure { throw failure }
        return answer
    }

    /// Sends one admin request and waits for its result event. The request's own timeout is `timeoutMs`;
    /// the wait allows a second more, so librdkafka's timeout (an error event) normally comes first.
    ///
    /// librdkafka sends both requests to the cluster's controller and waits for it until the timeout. A cluster
    /// whose metadata names a controller that is not one of its brokers could never answer, and would cost the
    /// whole timeout: librdkafka 2.0.2's mock cluster names controller 0 beside its brokers 1…n, and implements
    /// neither request. That is found out first, with one metadata round trip, and reported as `.unsupported`,
    /// as is a broker that answers the request without implementing it.
    private func request<Value>(
        _ operation: rd_kafka_admin_op_t, timeoutMs: Int32,
        send: (OpaquePointer, OpaquePointer) -> Void,
        read: (OpaquePointer) -> Value
    ) throws(KafkaError) -> AdminAnswer<Value> {
        let brokers = try brokerIds(timeoutMs: timeoutMs)
        let controller = rd_kafka_controllerid(client.rk, 0) // from the metadata just received
        guard brokers.contains(controller) else {
            return .unsupported("the cluster names controller \(controller), which is none of its brokers \(brokers.sorted())")
        }
        guard let queue = rd_kafka_queue_new(client.rk) else { throw .invalidArgument("rd_kafka_queue_new failed") }
        defer { rd_kafka_queue_destroy(queue) }
        guard let options = rd_kafka_AdminOptions_new(client.rk, operation) else {
            throw .invalidArgument("rd_kafka_AdminOptions_new failed")
        }
        defer { rd_kafka_AdminOptions_destroy(options) }
        var errstr = [CChar](repeating: 0, count: 512)
        var code = rd_kafka_AdminOptions_set_request_timeout(options, timeoutMs, &errstr, errstr.count)
        guard code == RD_KAFKA_RESP_ERR_NO_ERROR else { throw KafkaError(rd: code, message: rdString(errstr)) }
        if operation == RD_KAFKA_ADMIN_OP_CREATETOPICS {
            // Wait for the controller to have created the topics, so a metadata request right after sees them.
            code = rd_kafka_AdminOptions_set_operation_timeout(options, timeoutMs, &errstr, errstr.count)
            guard code == RD_KAFKA_RESP_ERR_NO_ERROR else { throw KafkaError(rd: code, message: rdString(errstr)) }
        }
        send(options, queue)
        guard let event = rd_kafka_queue_poll(queue, timeoutMs &+ 1000) else {
            throw .timedOut("no answer to the admin request within \(timeoutMs) ms")
        }
        defer { rd_kafka_event_destroy(event) }
        let error = rd_kafka_event_error(event)
        switch error {
        case RD_KAFKA_RESP_ERR_NO_ERROR:
            return .answered(read(event))
        case RD_KAFKA_RESP_ERR__UNSUPPORTED_FEATURE, RD_KAFKA_RESP_ERR_UNSUPPORTED_VERSION:
            return .unsupported(rd_kafka_event_error_string(event).map { String(cString: $0) } ?? String(cString: rd_kafka_err2str(error)))
        default:
            throw KafkaError(rd: error, message: rd_kafka_event_error_string(event).map { String(cString: $0) })
        }
    }
}
