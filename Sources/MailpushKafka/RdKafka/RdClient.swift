import CRdKafka
import Foundation
import Synchronization

/// What librdkafka calls back into, reached through the `rd_kafka_conf_set_opaque` pointer.
/// Immutable, so any librdkafka thread may read it.
final class RdCallbacks: Sendable {
    let log: KafkaLogHandler?
    let error: KafkaErrorHandler?
    let rebalance: RdRebalanceHandler?
    init(log: KafkaLogHandler?, error: KafkaErrorHandler?, rebalance: RdRebalanceHandler? = nil) {
        self.log = log
        self.error = error
        self.rebalance = rebalance
    }
}

/// A group consumer's rebalance callback: the client, the event (assign or revoke) and the partitions.
typealias RdRebalanceHandler = @Sendable (OpaquePointer, rd_kafka_resp_err_t, UnsafeMutablePointer<rd_kafka_topic_partition_list_t>) -> Void

/// Owns one `rd_kafka_t`.
///
/// `@unchecked Sendable` is sound: librdkafka handles are thread-safe (every public `rd_kafka_*` call may be
/// made from any thread concurrently), and the only lifecycle step that is not, `rd_kafka_destroy`, runs in
/// `deinit`, when no other reference (and so no other call) can exist.
final class RdClient: @unchecked Sendable {
    enum Role { case producer, consumer }

    let rk: OpaquePointer
    /// Kept alive until after `rd_kafka_destroy`, since librdkafka threads call into it until then.
    let callbacks: RdCallbacks
    private let poller: RdPoller?
    private let counted: Bool
    /// When set, `deinit` leaves the handle to the process's end instead of destroying it: librdkafka 2.0.2
    /// aborts in `rd_kafka_destroy` for a cooperative-sticky member that never received an assignment
    /// (librdkafka issue 4312, fixed in 2.3.0).
    let mustNotDestroy = Mutex(false)

    /// Clients of this process that talk to brokers, from `rd_kafka_new` until `rd_kafka_destroy` has returned
    /// (on a thread of its own, after the last release: `deinit`). A mock cluster's host is not one of them.
    static let undestroyed = Mutex(0)

    /// - Parameters:
    ///   - defaults: role defaults, applied before `bootstrap.servers`, `client.id` and the passthrough properties.
    ///   - servePollQueue: start a thread that serves the main queue (delivery reports, error events).
    ///     Consumers instead serve it from `consume`.
    ///   - counted: counted in `undestroyed` (every client but a mock cluster's host).
    ///   - closeAbortively: close broker connections with a reset (`rdCloseAbortively`).
    init(
        role: Role, configuration: KafkaConfiguration, defaults: KeyValuePairs<String, String>,
        servePollQueue: Bool, counted: Bool = true, rebalance: RdRebalanceHandler? = nil,
        closeAbortively: Bool = false
    ) throws(KafkaError) {
        guard let conf = rd_kafka_conf_new() else { throw .invalidArgument("rd_kafka_conf_new failed") }
        var confOwned = true
        defer { if confOwned { rd_kafka_conf_destroy(conf) } }

        let fixed: [(String, String)] = [
            ("bootstrap.servers", configuration.bootstrapServers),
            ("client.id", configuration.clientId),
        ]
        let passthrough = configuration.properties.sorted { $0.key < $1.key }.map { ($0.key, $0.value) }
        for (key, value) in Array(defaults) + fixed + passthrough {
            try Self.set(conf, key, value)
        }

        callbacks = RdCallbacks(log: configuration.logHandler, error: configuration.errorHandler, rebalance: rebalance)
        rd_kafka_conf_set_opaque(conf, Unmanaged.passUnretained(callbacks).toOpaque())
        rd_kafka_conf_set_log_cb(conf, rdLogCallback)
        rd_kafka_conf_set_error_cb(conf, rdErrorCallback)
        if rebalance != nil { rd_kafka_conf_set_rebalance_cb(conf, rdRebalanceCallback) }
        if role == .producer { rd_kafka_conf_set_dr_msg_cb(conf, rdDeliveryCallback) }
        if closeAbortively { rd_kafka_conf_set_closesocket_cb(conf, rdCloseAbortively) }

        var errstr = [CChar](repeating: 0, count: 512)
        let type = role == .producer ? RD_KAFKA_PRODUCER : RD_KAFKA_CONSUMER
        guard let rk = rd_kafka_new(type, conf, &errstr, errstr.count) else {
            throw .invalidArgument(rdString(errstr))
        }
        confOwned = false // rd_kafka_new took ownership
        self.rk = rk
        poller = servePollQueue ? RdPoller(rk: rk) : nil
        self.counted = counted
        if counted { Self.undestroyed.withLock { $0 += 1 } }
    }

    deinit {
        // rd_kafka_destroy joins librdkafka's threads, which can take seconds when brokers are unreachable,
        // and the last release may happen on Swift's cooperative pool: destroy on a thread of its own.
        let handle = Handle(rk: rk, callbacks: callbacks, poller: poller, counted: counted)
        if mustNotDestroy.withLock({ $0 }) {
            poller?.stop()
            if counted { Self.undestroyed.withLock { $0 -= 1 } }
            Self.leaked.withLock { $0.append(handle) }
            return
        }
        Thread.detachNewThread {
            Thread.current.name = "rdkafka-destroy"
            handle.destroy()
        }
    }

    /// Handles left undestroyed (`mustNotDestroy`), kept with their callbacks until the process ends.
    private static let leaked = Mutex<[Handle]>([])

    /// What `deinit` hands to the destroying thread. `@unchecked Sendable`: it is the only remaining
    /// owner of `rk`, used by that one thread.
    fileprivate final class Handle: @unchecked Sendable {
        let rk: OpaquePointer
        let callbacks: RdCallbacks
        let poller: RdPoller?
        let counted: Bool
        init(rk: OpaquePointer, callbacks: RdCallbacks, poller: RdPoller?, counted: Bool) {
            (self.rk, self.callbacks, self.poller, self.counted) = (rk, callbacks, poller, counted)
        }
        func destroy() {
            poller?.stop()
            rd_kafka_destroy(rk)
            if counted { RdClient.undestroyed.withLock { $0 -= 1 } }
            // `callbacks` is released after this returns: librdkafka no longer calls into it.
        }
    }

    /// Topics `learnTopics` has asked about.
    private let learnedTopics = Mutex<Set<String>>([])

    /// Asks the cluster now for the partitions and leaders of each topic of `topics` this client has not asked
    /// about before, blocking up to `timeoutMs` per topic.
    ///
    /// Why: librdkafka 2.0.2 learns a topic it was told about only by an assignment or a first produce in its
    /// topic scan, once a second. Measured on the development broker: a service's first fetch and its first
    /// produce each waited up to 1 s, and a partition assigned at a logical offset (`BEGINNING`) another 0.5 s
    /// (its offset query, sent before a leader was known, is retried after 500 ms). The answer lands in the
    /// client's metadata cache, from which every topic handle it makes later is filled.
    ///
    /// Best effort: a topic that does not answer in time is learned by that scan, as before. Only for topics that
    /// exist: a metadata request that names a topic creates it on brokers that auto-create topics.
    func learnTopics(_ topics: some Sequence<String>, timeoutMs: Int32) {
        let new = learnedTopics.withLock { learned in topics.filter { learned.insert($0).inserted } }
        for topic in new {
            guard let rkt = rd_kafka_topic_new(rk, topic, nil) else { continue }
            var metadata: UnsafePointer<rd_kafka_metadata_t>?
            _ = rd_kafka_metadata(rk, 0, rkt, &metadata, timeoutMs)
            if let metadata { rd_kafka_metadata_destroy(metadata) }
            rd_kafka_topic_destroy(rkt)
        }
    }

    private static func set(_ conf: OpaquePointer, _ key: String, _ value: String) throws(KafkaError) {
        var errstr = [CChar](repeating: 0, count: 512)
        if rd_kafka_conf_set(conf, key, value, &errstr, errstr.count) != RD_KAFKA_CONF_OK {
            // The value may be a secret (a misspelled `sasl.password` is still a password): never repeat it,
            // and librdkafka's own text quotes it for an invalid value.
            var reason = rdString(errstr)
            if !value.isEmpty { reason = reason.replacingOccurrences(of: value, with: "<value not shown>") }
            throw .invalidArgument("invalid configuration property \(key) (value not shown): \(reason)")
        }
    }

    /// The client's fatal error, if one was raised (idempotent producer sequence problems, etc.).
    func fatalError() -> KafkaError? {
        var errstr = [CChar](repeating: 0, count: 512)
        let code = rd_kafka_fatal_error(rk, &errstr, errstr.count)
        guard code != RD_KAFKA_RESP_ERR_NO_ERROR else { return nil }
        return KafkaError(rd: code, message: rdString(errstr), isFatal: true)
    }
}

/// A thread that serves the client's main queue with `rd_kafka_poll`. librdkafka only invokes delivery and
/// error callbacks from inside poll calls, and the queue grows until someone polls. A dedicated thread keeps
/// that blocking call off Swift's cooperative pool.
private final class RdPoller: @unchecked Sendable { // rk is thread-safe; `stopped` is behind a lock
    private let rk: OpaquePointer
    private let stopped = Mutex(false)
    private let exited = DispatchSemaphore(value: 0)

    init(rk: OpaquePointer) {
        self.rk = rk
        let thread = Thread { [self] in
            // Named from inside: swift-corelibs-foundation names the OS thread only when its own thread sets it,
            // so a name set before `start()` never reaches ps, perf or a core dump.
            Thread.current.name = "rdkafka-poll"
            while !stopped.withLock({ $0 }) { rd_kafka_poll(self.rk, 100) }
            exited.signal()
        }
        thread.start()
    }

    /// Returns once the thread no longer touches `rk`, so it may be destroyed.
    func stop() {
        stopped.withLock { $0 = true }
        rd_kafka_yield(rk) // cut the current rd_kafka_poll short
        exited.wait()
    }
}

/// A NUL-terminated error buffer filled in by librdkafka.
func rdString(_ buffer: [CChar]) -> String {
    String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
}

private func callbacks(_ rk: OpaquePointer?) -> RdCallbacks? {
    guard let rk, let opaque = rd_kafka_opaque(rk) else { return nil }
    return Unmanaged<RdCallbacks>.fromOpaque(opaque).takeUnretainedValue()
}

private let rdLogCallback: @convention(c) (OpaquePointer?, Int32, UnsafePointer<CChar>?, UnsafePointer<CChar>?) -> Void = {
    rk, level, facility, message in
    guard let log = callbacks(rk)?.log else { return }
    log(
        KafkaLogLevel(rawValue: level) ?? .debug,
        facility.map { String(cString: $0) } ?? "", message.map { String(cString: $0) } ?? "")
}

private let rdErrorCallback: @convention(c) (OpaquePointer?, Int32, UnsafePointer<CChar>?, UnsafeMutableRawPointer?) -> Void = {
    rk, code, reason, _ in
    guard let rk, let handler = callbacks(rk)?.error else { return }
    if code == RD_KAFKA_RESP_ERR__FATAL.rawValue {
        // The event only says "fatal"; the underlying cause is kept by the client.
        var errstr = [CChar](repeating: 0, count: 512)
        let cause = rd_kafka_fatal_error(rk, &errstr, errstr.count)
        handler(KafkaError(rd: cause, message: rdString(errstr), isFatal: true))
    } else {
        handler(KafkaError(rdCode: code, message: reason.map { String(cString: $0) }))
    }
}

private let rdRebalanceCallback:
    @convention(c) (OpaquePointer?, rd_kafka_resp_err_t, UnsafeMutablePointer<rd_kafka_topic_partition_list_t>?, UnsafeMutableRawPointer?)
        ->
        Void = { rk, code, partitions, _ in
            guard let rk, let partitions, let handler = callbacks(rk)?.rebalance else { return }
            handler(rk, code, partitions)
        }

private let rdDeliveryCallback: @convention(c) (OpaquePointer?, UnsafePointer<rd_kafka_message_t>?, UnsafeMutableRawPointer?) -> Void = {
    _, messagePointer, _ in
    guard let messagePointer, let opaque = messagePointer.pointee._private else { return }
    let message = messagePointer.pointee
    // Balances the passRetained in RdProducer.enqueue: librdkafka reports every enqueued message exactly once.
    let ticket = Unmanaged<DeliveryTicket>.fromOpaque(opaque).takeRetainedValue()
    if message.err == RD_KAFKA_RESP_ERR_NO_ERROR {
        ticket.report(DeliveryResult(partition: message.partition, offset: message.offset, error: nil))
    } else {
        ticket.report(
            DeliveryResult(
                partition: message.partition, offset: -1, error: KafkaError(rd: message.err),
                notWritten: rd_kafka_message_status(messagePointer) == RD_KAFKA_MSG_STATUS_NOT_PERSISTED))
    }
}

/// Closes a broker connection with a reset (SO_LINGER 0), so the kernel discards what the broker has not
/// acknowledged. librdkafka closes a connection whose request timed out; closed the ordinary way, the kernel
/// would go on retransmitting that request for up to about 100 s, and a network partition that heals in
/// that time would deliver records the producer had already reported as failed, after a newer owner of
/// their partition wrote its own (docs/exactly-once.md, "A paused owner writes nothing after it is replaced").
private let rdCloseAbortively: @convention(c) (Int32, UnsafeMutableRawPointer?) -> Int32 = { socket, _ in
    var reset = linger(l_onoff: 1, l_linger: 0)
    _ = setsockopt(socket, SOL_SOCKET, SO_LINGER, &reset, socklen_t(MemoryLayout<linger>.size))
    return close(socket)
}
