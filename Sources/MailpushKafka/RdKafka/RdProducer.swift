import CRdKafka

/// Typed wrapper over librdkafka's producer calls. Delivery reports are served by the client's poll thread.
final class RdProducer: Sendable {
    let client: RdClient

    /// Defaults for a durable, ordered producer. Idempotence makes librdkafka's internal retries
    /// (of retriable Produce errors) free of duplicates and reordering.
    static let defaults: KeyValuePairs<String, String> = [
        "enable.idempotence": "true",
        "acks": "all",
        // A batch's records are enqueued together and then awaited: lingering would only delay them (the
        // records enqueued while a request is in flight still travel together in the next one).
        "linger.ms": "0",
        "batch.num.messages": "10000",
        "batch.size": "1000000",
        // The Java client's key hashing, so keyed records land where any other Kafka client would put them.
        "partitioner": "murmur2_random",
    ]

    init(configuration: KafkaConfiguration) throws(KafkaError) {
        client = try RdClient(role: .producer, configuration: configuration, defaults: Self.defaults,
                              servePollQueue: true)
    }

    enum EnqueueResult {
        case enqueued
        case queueFull
        case failed(KafkaError)
    }

    /// Hands one record to librdkafka (it copies all bytes). On `.enqueued`, `ticket` will receive exactly
    /// one delivery report from the poll thread.
    func enqueue(_ record: OutgoingRecord, ticket: DeliveryTicket) -> EnqueueResult {
        // librdkafka wants NUL-terminated names and separate byte ranges; lay them all out in one buffer
        // so a single closure keeps every pointer valid for the call. A range of length 0 still gets a
        // non-NULL pointer, which librdkafka distinguishes from NULL (empty vs. null key/value/header).
        var arena: [UInt8] = []
        func append(_ bytes: [UInt8]?, nulTerminated: Bool = false) -> Range<Int>? {
            guard let bytes else { return nil }
            let start = arena.count
            arena += bytes
            if nulTerminated { arena.append(0) }
            return start..<(start + bytes.count)
        }
        let topic = append(Array(record.topic.utf8), nulTerminated: true)!
        let key = append(record.key)
        let value = append(record.value)
        let headers = record.headers.map { (append(Array($0.key.utf8), nulTerminated: true)!, append($0.value)) }

        let opaque = Unmanaged.passRetained(ticket).toOpaque()
        let error: OpaquePointer? = arena.withUnsafeMutableBytes { buffer in
            let base = buffer.baseAddress!
            func vu(_ type: rd_kafka_vtype_t, _ fill: (inout rd_kafka_vu_t) -> Void) -> rd_kafka_vu_t {
                var v = rd_kafka_vu_t()
                v.vtype = type
                fill(&v)
                return v
            }
            var vus = [
                vu(RD_KAFKA_VTYPE_TOPIC) { $0.u.cstr = UnsafeRawPointer(base + topic.lowerBound).assumingMemoryBound(to: CChar.self) },
                vu(RD_KAFKA_VTYPE_MSGFLAGS) { $0.u.i = RD_KAFKA_MSG_F_COPY },
                vu(RD_KAFKA_VTYPE_OPAQUE) { $0.u.ptr = opaque },
                vu(RD_KAFKA_VTYPE_TIMESTAMP) { $0.u.i64 = record.timestampMs ?? 0 },  // 0: now
                vu(RD_KAFKA_VTYPE_KEY) { $0.u.mem.ptr = key.map { base + $0.lowerBound }; $0.u.mem.size = key?.count ?? 0 },
                vu(RD_KAFKA_VTYPE_VALUE) { $0.u.mem.ptr = value.map { base + $0.lowerBound }; $0.u.mem.size = value?.count ?? 0 },
            ]
            for (name, headerValue) in headers {
                vus.append(vu(RD_KAFKA_VTYPE_HEADER) {
                    $0.u.header.name = UnsafeRawPointer(base + name.lowerBound).assumingMemoryBound(to: CChar.self)
                    $0.u.header.val = headerValue.map { UnsafeRawPointer(base + $0.lowerBound) }
                    $0.u.header.size = headerValue?.count ?? 0
                })
            }
            return rd_kafka_produceva(client.rk, vus, vus.count)
        }
        guard let error else { return .enqueued }

        Unmanaged<DeliveryTicket>.fromOpaque(opaque).release()  // not enqueued: no report will come
        if rd_kafka_error_code(error) == RD_KAFKA_RESP_ERR__QUEUE_FULL {
            rd_kafka_error_destroy(error)
            return .queueFull
        }
        return .failed(KafkaError(consuming: error))
    }

    /// Messages not yet delivered plus delivery reports not yet served.
    var outstanding: Int { Int(rd_kafka_outq_len(client.rk)) }
}
