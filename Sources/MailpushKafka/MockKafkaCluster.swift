import Foundation

/// librdkafka's in-process mock cluster: the development broker. Real loopback TCP listeners, so any Kafka
/// client (kcat included) can talk to it.
///
/// Behaviour of librdkafka 2.0.2's mock that matters to us:
/// - Any Metadata request that names a missing topic creates it, with 4 partitions: the mock speaks Metadata
///   v0–v2, which has no AllowAutoTopicCreation flag, so `allow.auto.create.topics=false` is ignored. So
///   producing to a topic, assigning it to a consumer, or asking for its offsets all create it.
///   (`KafkaCluster.partitionCount` lists all topics instead, so it never creates one.)
/// - Produce requests are not deduplicated: the mock only checks sequence numbers for transactional
///   producers. A Produce request failed by `pushRequestErrors` appends nothing, so retries never duplicate.
/// - Record batches are stored verbatim (only the base offset is rewritten), so keys, values, headers and
///   producer timestamps survive produce → fetch unchanged.
/// - ListOffsets by timestamp is not implemented (see `KafkaCluster.offsets(forTimestampMs:)`).
/// - Each partition keeps at most 5 MB / 100000 batches; older batches are dropped, advancing the start offset.
/// - Its sockets leave Nagle's algorithm on; `RdMock` turns it off (see `RdMock.disableNagle`).
public final class MockKafkaCluster: Sendable {
    let mock: RdMock

    /// - Parameter defaultPartitions: partitions of auto-created topics. librdkafka 2.0.2 fixes this at 4
    ///   and offers no setter, so any other value throws; create such topics with `createTopic`.
    public init(brokers: Int = 1, defaultPartitions: Int = 4) throws(KafkaError) {
        guard defaultPartitions == 4 else {
            throw .invalidArgument(
                "librdkafka 2.0.2's mock cluster always auto-creates topics with 4 partitions "
                    + "(asked for \(defaultPartitions)); use createTopic(_:partitions:) instead")
        }
        mock = try RdMock(brokers: brokers)
    }

    /// "127.0.0.1:PORT[,…]", one address per broker (broker ids are 1…brokers).
    public var bootstrapServers: String { mock.bootstraps }

    /// Throws `TOPIC_ALREADY_EXISTS` if it exists (possibly auto-created by an earlier produce).
    public func createTopic(_ name: String, partitions: Int) throws(KafkaError) {
        try mock.createTopic(name, partitions: partitions)
    }

    /// The next `errors.count` requests with `apiKey` (see `KafkaApiKey`), to any broker, fail with these
    /// broker error codes in order, without being processed (a failed Produce appends nothing).
    public func pushRequestErrors(apiKey: Int16, errors: [Int32]) { mock.pushRequestErrors(apiKey: apiKey, errors: errors) }
    public func clearRequestErrors(apiKey: Int16) { mock.clearRequestErrors(apiKey: apiKey) }

    /// Metadata requests answer the broker error `code` for `topic` (e.g. 29, topic authorization failed), as a
    /// broker does for a topic this client may not see; 0 lifts it.
    public func setTopicError(_ topic: String, code: Int32) { mock.setTopicError(topic, code: code) }

    /// Closes the broker's connections and refuses new ones; partition leadership does not move.
    /// Broker ids are 1…brokers; -1 means all brokers.
    ///
    /// - Warning: librdkafka closes the broker's listening socket and at once binds a new one to the same
    ///   port, aborting the whole process if that bind fails. It fails when a child process is being spawned
    ///   at that moment (the child briefly holds an inherited copy of the listening socket), so never run
    ///   this concurrently with `Process.run()` / `posix_spawn` in the same process.
    public func setBrokerDown(_ id: Int32) { mock.setBrokerDown(id) }
    public func setBrokerUp(_ id: Int32) { mock.setBrokerUp(id) }
    public func setRoundTripTime(broker: Int32, milliseconds: Int) { mock.setRoundTripTime(broker: broker, milliseconds: milliseconds) }

    /// Shuts the brokers down (also done on deinit). Idempotent; later calls do nothing.
    public func close() { mock.destroy() }

    /// Shuts the brokers down once every other Kafka client of this process is destroyed, waiting at most
    /// `timeout` (then closes anyway). For a process that ends with its embedded broker: librdkafka destroys
    /// a released client on a thread of its own, and a client still shutting down when its broker goes away
    /// tries to reconnect and logs "Connection refused" errors.
    public func close(afterOtherClientsWithin timeout: Duration) {
        let deadline = ContinuousClock.now + timeout
        while RdClient.undestroyed.withLock({ $0 }) > 0, ContinuousClock.now < deadline {
            Thread.sleep(forTimeInterval: 0.002)
        }
        close()
    }
}
