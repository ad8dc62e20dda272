import CRdKafka
import Synchronization

/// Typed wrapper over librdkafka's producer calls. Delivery reports are served by the client's poll thread.
final class RdProducer: Sendable {
    let client: RdClient

    /// Defaults for a durable, ordered producer. Idempotence makes librdkafka's internal retries
    /// (of retriable Produce errors) free of duplicates and reordering.
    static let defaults: KeyValuePairs<String, String> = [
        "enable.idempotence": "true",
        "acks": "all",
        "linger.ms": "5",
        "batch.num.messages": "10000",
        "batch.size": "1000000",
        // The Java client's key hashing, so keyed records land where any other Kafka client would put them.
        "partitioner": "murmur2_random",
    ]

    /// One topic handle per topic produced to, made on its first record and kept until the producer is gone.
    ///
    /// Why: a record given by topic name makes librdkafka look the topic up under the client's write lock,
    /// which its broker threads take for reading all the time; a record given by handle only counts a reference.
    /// Side by side, the drain's CPU per job went down by about 2% (fourteen interleaved rounds), the steady
    /// load's by about 1.4% (docs/performance.md, session 22).
    private let topicHandles = Mutex<[(name: String, handle: OpaquePointer)]>([])

    /// Its connections close with a reset: the bytes of a request librdkafka has given up on must not reach the
    /// broker later.
    init(configuration: KafkaConfiguration) throws(KafkaError) {
        client = try RdClient(
            role: .producer, configuration: configuration, defaults: Self.defaults,
            servePollQueue: true, closeAbortively: true)
    }

    deinit {
        // Before the client: a topic handle must not outlive its librdkafka instance.
        topicHandles.withLock { handles in
            for topic in handles { rd_kafka_topic_destroy(topic.handle) }
            handles = []
        }
    }

    /// The kept handle of `topic`; nil if librdkafka makes none (the record then goes by name, and whatever is
    /// wrong with the topic is reported for it).
    private func topicHandle(_ topic: String) -> OpaquePointer? {
        topicHandles.withLock { handles in
            // Few topics (jobs, dead letters, state); the names are usually the very same strings.
            if let known = handles.first(where: { $0.name == topic }) { return known.handle }
            guard let handle = rd_kafka_topic_new(client.rk, topic, nil) else { return nil }
            handles.append((topic, handle))
            return handle
        }
    }

    /// Blocks up to `timeoutMs` per topic: see `RdClient.learnTopics`.
    func learnTopics(_ topics: [String], timeoutMs: Int32) { client.learnTopics(topics, timeoutMs: timeoutMs) }

    enum EnqueueResult {
        case enqueued
        case queueFull
        case failed(KafkaError)
    }

    /// Hands one record to librdkafka (it copies all bytes). On `.enqueued`, `ticket` will receive exactly
    /// one delivery report from the poll thread.
    ///
    /// Runs once per output record: the topic, key and value are passed where they lie. The headers go as one
    /// `rd_kafka_headers_t` of ours (`RD_KAFKA_VTYPE_HEADERS`), which librdkafka owns once the record is enqueued
    /// and we free when it is not. Passed one by one (`RD_KAFKA_VTYPE_HEADER`), librdkafka 2.0.2 builds that list
    /// itself and frees it twice when it refuses a record at once (an unknown partition, a topic in error:
    /// librdkafka issue 4627), which crashed the process; the allocations are the same either way.
    func enqueue(_ record: OutgoingRecord, ticket: DeliveryTicket) -> EnqueueResult {
        let headers = record.headers.isEmpty ? nil : Self.headerList(record.headers)
        let opaque = Unmanaged.passRetained(ticket).toOpaque()
        let handle = topicHandle(record.topic)
        let error: OpaquePointer? = record.topic.withCString { topic in
            withBytes(record.key) { key in
                withBytes(record.value) { value in
                    withUnsafeTemporaryAllocation(of: rd_kafka_vu_t.self, capacity: 8) { vus in
                        var count = 0
                        func vu(_ type: rd_kafka_vtype_t, _ fill: (inout rd_kafka_vu_t) -> Void) {
                            var v = rd_kafka_vu_t()
                            v.vtype = type
                            fill(&v)
                            vus.initializeElement(at: count, to: v)
                            count += 1
                        }
                        if let handle {
                            vu(RD_KAFKA_VTYPE_RKT) { $0.u.rkt = handle }
                        } else {
                            vu(RD_KAFKA_VTYPE_TOPIC) { $0.u.cstr = topic }
                        }
                        vu(RD_KAFKA_VTYPE_MSGFLAGS) { $0.u.i = RD_KAFKA_MSG_F_COPY }
                        vu(RD_KAFKA_VTYPE_OPAQUE) { $0.u.ptr = opaque }
                        vu(RD_KAFKA_VTYPE_TIMESTAMP) { $0.u.i64 = record.timestampMs ?? 0 } // 0: now
                        vu(RD_KAFKA_VTYPE_KEY) {
                            $0.u.mem.ptr = key.map { UnsafeMutableRawPointer(mutating: $0.baseAddress!) }
                            $0.u.mem.size = key?.count ?? 0
                        }
                        vu(RD_KAFKA_VTYPE_VALUE) {
                            $0.u.mem.ptr = value.map { UnsafeMutableRawPointer(mutating: $0.baseAddress!) }
                            $0.u.mem.size = value?.count ?? 0
                        }
                        // RD_KAFKA_PARTITION_UA (-1): the partitioner chooses.
                        vu(RD_KAFKA_VTYPE_PARTITION) { $0.u.i32 = record.partition ?? -1 }
                        if let headers { vu(RD_KAFKA_VTYPE_HEADERS) { $0.u.headers = headers } }
                        return rd_kafka_produceva(client.rk, vus.baseAddress, count)
                    }
                }
            }
        }
        guard let error else { return .enqueued }

        if let headers { rd_kafka_headers_destroy(headers) } // still ours: the record was not enqueued
        Unmanaged<DeliveryTicket>.fromOpaque(opaque).release() // not enqueued: no report will come
        if rd_kafka_error_code(error) == RD_KAFKA_RESP_ERR__QUEUE_FULL {
            rd_kafka_error_destroy(error)
            return .queueFull
        }
        return .failed(KafkaError(consuming: error))
    }

    /// The headers as a librdkafka header list (it copies names and values); a null value stays null.
    private static func headerList(_ headers: [KafkaHeader]) -> OpaquePointer {
        let list = rd_kafka_headers_new(headers.count)!
        for header in headers {
            header.key.withCString { name in
                withBytes(header.value) { value in
                    // Fails only for a read-only list, which a new one is not.
                    _ = rd_kafka_header_add(list, name, -1, value?.baseAddress, value?.count ?? 0)
                }
            }
        }
        return list
    }

    /// Messages not yet delivered plus delivery reports not yet served.
    var outstanding: Int { Int(rd_kafka_outq_len(client.rk)) }

    /// Drops the records still waiting in librdkafka's queue (never sent, so never written); each gets a
    /// delivery report with `_PURGE_QUEUE`. Records already in a request to the broker are left alone:
    /// their reports say whether they were written.
    func purgeQueued() -> KafkaError? {
        let code = rd_kafka_purge(client.rk, Int32(RD_KAFKA_PURGE_F_QUEUE))
        return code == RD_KAFKA_RESP_ERR_NO_ERROR ? nil : KafkaError(rd: code)
    }
}

/// The bytes of `bytes` for a C call, nil for nil. An empty array still gets a non-NULL pointer: librdkafka
/// tells an empty key, value or header (non-NULL, size 0) from a null one (NULL).
private func withBytes<R>(_ bytes: [UInt8]?, _ body: (UnsafeRawBufferPointer?) -> R) -> R {
    guard let bytes else { return body(nil) }
    if bytes.isEmpty {
        return withUnsafeTemporaryAllocation(byteCount: 1, alignment: 1) { body(UnsafeRawBufferPointer(start: $0.baseAddress, count: 0)) }
    }
    return bytes.withUnsafeBytes { body($0) }
}
