import CRdKafka

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

    init(configuration: KafkaConfiguration) throws(KafkaError) {
        client = try RdClient(
            role: .producer, configuration: configuration, defaults: Self.defaults,
            servePollQueue: true)
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
    /// Runs once per output record, so it makes no heap allocation of its own: the topic, key and value are
    /// passed where they lie, and the header names (NUL-terminated) and values are laid out in one stack buffer.
    func enqueue(_ record: OutgoingRecord, ticket: DeliveryTicket) -> EnqueueResult {
        let headerBytes = record.headers.reduce(0) { $0 + $1.key.utf8.count + 1 + ($1.value?.count ?? 0) }
        let opaque = Unmanaged.passRetained(ticket).toOpaque()
        let error: OpaquePointer? = record.topic.withCString { topic in
            withBytes(record.key) { key in
                withBytes(record.value) { value in
                    withUnsafeTemporaryAllocation(byteCount: max(1, headerBytes), alignment: 1) { arena in
                        withUnsafeTemporaryAllocation(of: rd_kafka_vu_t.self, capacity: 7 + record.headers.count) { vus in
                            func vu(_ index: Int, _ type: rd_kafka_vtype_t, _ fill: (inout rd_kafka_vu_t) -> Void) {
                                var v = rd_kafka_vu_t()
                                v.vtype = type
                                fill(&v)
                                vus.initializeElement(at: index, to: v)
                            }
                            vu(0, RD_KAFKA_VTYPE_TOPIC) { $0.u.cstr = topic }
                            vu(1, RD_KAFKA_VTYPE_MSGFLAGS) { $0.u.i = RD_KAFKA_MSG_F_COPY }
                            vu(2, RD_KAFKA_VTYPE_OPAQUE) { $0.u.ptr = opaque }
                            vu(3, RD_KAFKA_VTYPE_TIMESTAMP) { $0.u.i64 = record.timestampMs ?? 0 } // 0: now
                            vu(4, RD_KAFKA_VTYPE_KEY) {
                                $0.u.mem.ptr = key.map { UnsafeMutableRawPointer(mutating: $0.baseAddress!) }
                                $0.u.mem.size = key?.count ?? 0
                            }
                            vu(5, RD_KAFKA_VTYPE_VALUE) {
                                $0.u.mem.ptr = value.map { UnsafeMutableRawPointer(mutating: $0.baseAddress!) }
                                $0.u.mem.size = value?.count ?? 0
                            }
                            // RD_KAFKA_PARTITION_UA (-1): the partitioner chooses.
                            vu(6, RD_KAFKA_VTYPE_PARTITION) { $0.u.i32 = record.partition ?? -1 }
                            var used = 0
                            func copy(_ bytes: some Sequence<UInt8>) {
                                for byte in bytes {
                                    arena[used] = byte
                                    used += 1
                                }
                            }
                            for (index, header) in record.headers.enumerated() {
                                let name = arena.baseAddress! + used
                                copy(header.key.utf8)
                                copy(CollectionOfOne(0))
                                let valueStart = arena.baseAddress! + used
                                if let headerValue = header.value { copy(headerValue) }
                                vu(7 + index, RD_KAFKA_VTYPE_HEADER) {
                                    $0.u.header.name = UnsafeRawPointer(name).assumingMemoryBound(to: CChar.self)
                                    $0.u.header.val = header.value.map { _ in UnsafeRawPointer(valueStart) }
                                    $0.u.header.size = header.value?.count ?? 0
                                }
                            }
                            return rd_kafka_produceva(client.rk, vus.baseAddress, vus.count)
                        }
                    }
                }
            }
        }
        guard let error else { return .enqueued }

        Unmanaged<DeliveryTicket>.fromOpaque(opaque).release() // not enqueued: no report will come
        if rd_kafka_error_code(error) == RD_KAFKA_RESP_ERR__QUEUE_FULL {
            rd_kafka_error_destroy(error)
            return .queueFull
        }
        return .failed(KafkaError(consuming: error))
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
