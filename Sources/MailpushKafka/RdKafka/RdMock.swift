import CRdKafka
import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// Typed wrapper over librdkafka's mock cluster API.
///
/// `@unchecked Sendable`: the mock functions only post commands to the mock cluster's own thread and wait
/// for the reply, so they may be called from any thread. Every call holds the `destroyed` lock, so none
/// can run during or after `destroy`.
final class RdMock: @unchecked Sendable {
    /// The mock cluster lives inside this client's instance; it runs its own thread.
    private let client: RdClient
    private let cluster: OpaquePointer
    private let destroyed = Mutex(false)
    let brokerCount: Int

    init(brokers: Int) throws(KafkaError) {
        guard brokers >= 1 else { throw .invalidArgument("a mock cluster needs at least one broker, got \(brokers)") }
        client = try RdClient(
            role: .producer, configuration: KafkaConfiguration(bootstrapServers: ""),
            defaults: [:], servePollQueue: true, counted: false)
        guard let cluster = rd_kafka_mock_cluster_new(client.rk, Int32(brokers)) else {
            throw .invalidArgument("rd_kafka_mock_cluster_new failed")
        }
        self.cluster = cluster
        brokerCount = brokers
        disableNagle()
    }

    deinit { destroy() }

    /// Runs `body` unless the cluster is destroyed.
    private func ifAlive<R>(_ body: (OpaquePointer) throws(KafkaError) -> R) throws(KafkaError) -> R {
        // Filled in under the lock rather than returned from it: `Mutex.withLock` returns only `sending`
        // values, and `R` need not be Sendable.
        var result: Result<R, KafkaError> = .failure(
            KafkaError(
                rdCode: KafkaError.Code.destroyed,
                message: "mock cluster is closed"))
        destroyed.withLock { destroyed in
            if !destroyed { result = Result { () throws(KafkaError) in try body(cluster) } }
        }
        return try result.get()
    }

    /// "127.0.0.1:port,…", one listener per broker; "" once destroyed.
    var bootstraps: String { (try? ifAlive { String(cString: rd_kafka_mock_cluster_bootstraps($0)) }) ?? "" }

    func createTopic(_ name: String, partitions: Int) throws(KafkaError) {
        guard partitions >= 1 else { throw .invalidArgument("topic \(name) needs at least one partition, got \(partitions)") }
        let replication = Int32(min(3, brokerCount))
        let code = try ifAlive { rd_kafka_mock_topic_create($0, name, Int32(partitions), replication) }
        guard code == RD_KAFKA_RESP_ERR_NO_ERROR else {
            throw KafkaError(rd: code, message: "create topic \(name): \(String(cString: rd_kafka_err2str(code)))")
        }
    }

    /// The next `errors.count` requests with this API key (to any broker) fail with these codes, in order.
    func pushRequestErrors(apiKey: Int16, errors: [Int32]) {
        var codes = errors.map { rd_kafka_resp_err_t(rawValue: $0) }
        try? ifAlive { rd_kafka_mock_push_request_errors_array($0, apiKey, codes.count, &codes) }
    }

    func clearRequestErrors(apiKey: Int16) { try? ifAlive { rd_kafka_mock_clear_request_errors($0, apiKey) } }

    /// Metadata requests answer `code` for `topic` (0: no error again).
    func setTopicError(_ topic: String, code: Int32) {
        try? ifAlive { rd_kafka_mock_topic_set_error($0, topic, rd_kafka_resp_err_t(rawValue: code)) }
    }

    // These only fail for an unknown broker id, which is a test bug the test itself will show.
    // Going down re-creates the listening socket (same port): it needs TCP_NODELAY again.
    func setBrokerDown(_ id: Int32) {
        _ = try? ifAlive { rd_kafka_mock_broker_set_down($0, id) }
        disableNagle()
    }
    func setBrokerUp(_ id: Int32) {
        _ = try? ifAlive { rd_kafka_mock_broker_set_up($0, id) }
        disableNagle()
    }
    func setRoundTripTime(broker: Int32, milliseconds: Int) {
        _ = try? ifAlive { rd_kafka_mock_broker_set_rtt($0, broker, Int32(clamping: milliseconds)) }
    }

    /// Stops the brokers (clients see their connections close). Idempotent. The hosting client goes with deinit.
    func destroy() {
        destroyed.withLock { destroyed in
            if !destroyed { rd_kafka_mock_cluster_destroy(cluster) }
            destroyed = true
        }
    }
}

extension RdMock {
    /// The brokers' listening ports.
    var ports: Set<UInt16> {
        Set(bootstraps.split(separator: ",").compactMap { address in address.split(separator: ":").last.flatMap { UInt16($0) } })
    }

    /// Sets TCP_NODELAY on every socket of this process bound to one of the mock brokers' ports.
    ///
    /// librdkafka 2.0.2's mock never disables Nagle's algorithm. A response it writes while the client has not
    /// yet acknowledged the previous one's last segment is held until that ACK comes, and Linux delays ACKs by
    /// up to 40 ms: the second of two produce requests in flight, and any response written in pieces, came
    /// 40 ms late. Accepted sockets inherit the option from the listening socket, so setting it on the
    /// listeners (the mock makes them synchronously, in `rd_kafka_mock_cluster_new` and on `set_down`)
    /// covers every connection made after; sockets already accepted on these ports are set too.
    fileprivate func disableNagle() {
        var on: Int32 = 1
        for descriptor in Self.tcpSockets(boundTo: ports) {
            _ = setsockopt(descriptor, Int32(IPPROTO_TCP), TCP_NODELAY, &on, socklen_t(MemoryLayout<Int32>.size))
        }
    }

    /// This process's IPv4 TCP sockets (listening or connected) whose local port is one of `ports`.
    static func tcpSockets(boundTo ports: Set<UInt16>) -> [Int32] {
        guard !ports.isEmpty else { return [] }
        var limit = rlimit()
        getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
        // The mock's sockets are among the first descriptors a process opens; the cap bounds the scan.
        let highest = Int32(clamping: min(UInt64(limit.rlim_cur), 65_536))
        return (0..<highest).filter { descriptor in
            guard let port = localTCPPort(descriptor) else { return false }
            return ports.contains(port)
        }
    }

    private static func localTCPPort(_ descriptor: Int32) -> UInt16? {
        var status = stat()
        guard fstat(descriptor, &status) == 0, (status.st_mode & S_IFMT) == S_IFSOCK else { return nil }
        var type: Int32 = 0
        var typeLength = socklen_t(MemoryLayout<Int32>.size)
        guard getsockopt(descriptor, SOL_SOCKET, SO_TYPE, &type, &typeLength) == 0, type == Int32(SOCK_STREAM.rawValue)
        else { return nil }
        var address = sockaddr_in()
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let named = withUnsafeMutablePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(descriptor, $0, &length) }
        }
        guard named == 0, Int32(address.sin_family) == AF_INET else { return nil }
        return UInt16(bigEndian: address.sin_port)
    }
}
