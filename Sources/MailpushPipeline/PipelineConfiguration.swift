import MailpushCore
import MailpushKafka

/// Topic names (CONTRACT §1); every one is configurable.
public struct Topics: Sendable, Hashable {
    public var events = "email.received"
    public var devices = "mailpush.devices"
    public var addressKeys = "mailpush.address-keys"
    public var jobs = "mailpush.push-jobs"
    public var deadLetters = "mailpush.dead-letters"
    /// mailpush's own compacted topic: partition state handed over between the instances of a fleet.
    public var state = "mailpush.state"

    public init() {}

    /// The topics the contract names; a development broker creates all of them.
    public var all: [String] { [events, devices, addressKeys, jobs, deadLetters, state] }
}

/// Static partition ownership (CONTRACT §8): instance `index` of `count` owns event partitions `p % count == index`.
public struct Ownership: Sendable, Hashable, CustomStringConvertible {
    public var index: Int
    public var count: Int

    public init(index: Int = 0, count: Int = 1) {
        precondition(count >= 1 && index >= 0 && index < count, "validated by the command line")
        self.index = index
        self.count = count
    }

    public func owns(partition: Int32) -> Bool { Int(partition) % count == index }
    public var description: String { "instance \(index) of \(count)" }
}

/// How this instance comes to own event partitions: one choice, made on the command line.
public enum PartitionOwnership: Sendable, Hashable, CustomStringConvertible {
    /// Static ownership (CONTRACT §8.2): no group, nothing handed over.
    case fixed(Ownership)
    /// A consumer group (CONTRACT §8.1): partitions move between instances with their state.
    case group(GroupSettings)

    public var groupSettings: GroupSettings? {
        if case .group(let settings) = self { settings } else { nil }
    }

    public var description: String {
        switch self {
        case .fixed(let ownership): "static, \(ownership)"
        case .group(let settings): "consumer group \(settings.id)"
        }
    }
}

/// Group ownership (CONTRACT §8.1): instances of one consumer group share the event partitions, which move
/// between them with their state (through `Topics.state`).
///
/// The timings are chosen so that the fleet heals in seconds with no flag set (docs/operations.md, "Group
/// timing", argues each for real clusters). A librdkafka property given with `-X` wins over the matching one here.
public struct GroupSettings: Sendable, Hashable {
    public var id: String
    /// `group.instance.id`: static membership, so that a member restarting within the session gets its
    /// partitions back without a rebalance. nil: dynamic membership.
    public var instanceId: String?
    /// `session.timeout.ms`: how long a silent member keeps its partitions. 6 s is the smallest session a
    /// broker accepts by default (`group.min.session.timeout.ms`); librdkafka's own default is 45 s, which is
    /// what a restart or a dead member would cost.
    public var sessionTimeout: Duration = .seconds(6)
    /// `heartbeat.interval.ms`: how soon a member hears of a rebalance (a round ends once every member has
    /// rejoined) and how fresh the coordinator's last sign of life from a member that dies is; a twelfth of the
    /// session, so that several lost heartbeats in a row do not cost the membership.
    public var heartbeatInterval: Duration = .milliseconds(500)
    /// How long a look at the state topic lets this instance write for a partition (docs/exactly-once.md, "A
    /// fleet"); renewed every `leaseDuration / 4`.
    public var leaseDuration: Duration = .seconds(1)
    /// How often, at most, each partition's committed batch records are written to the state topic (joined meanwhile;
    /// the partitions take turns within it, `BatchStatePublisher.slices`; zero: as soon as the write before has
    /// landed). Under a steady load over many partitions a record per partition per batch was the group's main cost
    /// per job (about 1,700 records a second at 6,450 events/s over 64 partitions); 250 ms cut them to about 250 a
    /// second, and 1 s to about 60 (2% less CPU per job side by side, the same p50, and a state topic about three
    /// times smaller: docs/performance.md, session 29). What waits meanwhile is kept in the state directory, so a
    /// crash loses none of it; a successor reads back at most one interval more of outputs.
    public var stateWriteInterval: Duration = .seconds(1)
    /// The producers' `message.timeout.ms` in a fleet: how long a replaced owner's queued outputs may still
    /// leave, so it bounds the takeover wait after an owner that did not release (lease + this + 0.5 s).
    public var messageTimeout: Duration = .milliseconds(1500)
    /// How long a revocation waits for the batch in flight; past it the group moves the partitions anyway,
    /// and the epoch fence keeps this instance from writing for them (the next owner's claim fences it).
    public var revocationTimeout: Duration = .seconds(60)

    public init(id: String) { self.id = id }

    /// The librdkafka properties of the group member for these timings.
    var memberProperties: [String: String] {
        var properties = [
            "session.timeout.ms": "\(sessionTimeout.milliseconds)", "heartbeat.interval.ms": "\(heartbeatInterval.milliseconds)",
        ]
        properties["group.instance.id"] = instanceId
        return properties
    }
}

/// Where to start reading an event partition the state has no offset for.
public enum InitialPosition: String, Sendable, CaseIterable {
    case earliest, latest
}

public struct PipelineConfiguration: Sendable {
    public var kafka: KafkaConfiguration
    public var topics = Topics()
    /// Static ownership or a group (the command line's default; this type's default is one static instance).
    public var ownership = PartitionOwnership.fixed(Ownership())
    /// The group's settings; nil with static ownership.
    var group: GroupSettings? { ownership.groupSettings }
    public var render = RenderOptions()
    public var dedupeWindowSeconds: Int64 = 7 * 24 * 3600
    /// Up to 100 years, so that the window in milliseconds, taken from any time, stays an `Int64`.
    public static let dedupeWindowSecondsRange: ClosedRange<Int64> = 0...3_153_600_000
    /// The largest `--batch-size` of a group member: a batch's dedupe entries of one partition travel in one state
    /// record, which must stay under what the producer takes (`PartitionStateRecord.maxEmails`).
    public static let maxGroupBatchSize = PartitionStateRecord.maxEmails
    /// Most records of `email.received` processed (and committed) together (`--batch-size`).
    public var maxBatchSize = 8000
    /// Most records one poll takes. A backlog's batch is one poll. A batch grows past its first poll only while the
    /// batch before it waits for its acknowledgements (`Lookahead`), up to `maxBatchSize`: a broker slow to
    /// acknowledge then holds back no event that arrives meanwhile (docs/performance.md, session 27).
    public var pollRecords: Int { min(maxBatchSize, Self.pollRecordsLimit) }
    public static let pollRecordsLimit = 2000
    /// About the most bytes of events' keys and values one poll takes, and a batch gathers past its first poll. The
    /// count alone let a backlog of large events (up to the broker's 1 MB each) hold hundreds of MB while a batch
    /// waited for its acknowledgements; ordinary events (under 1 KB) reach `maxBatchSize` first.
    public var maxBatchBytes = Self.defaultMaxBatchBytes
    public static let defaultMaxBatchBytes = 8 << 20
    public var initialPosition = InitialPosition.earliest
    public var kafkaRequestTimeout: Duration = .seconds(10)
    /// Owners and addresses whose parsed registrations and keys stay in memory.
    public var configCacheOwners = 20_000
    public var configCacheAddresses = 10_000

    var configCache: ConfigDirectory.CacheCapacity {
        ConfigDirectory.CacheCapacity(owners: configCacheOwners, addresses: configCacheAddresses)
    }

    public init(kafka: KafkaConfiguration) {
        self.kafka = kafka
    }

    /// Settings for the development broker (librdkafka's mock cluster), each applied unless set with `-X`.
    /// Real brokers keep librdkafka's defaults: they do not share these two quirks of the mock.
    /// - `fetch.wait.max.ms`: the mock holds a fetch that found nothing for the whole wait (librdkafka's
    ///   default: 500 ms), even when records arrive meanwhile, so a quiet-time event would wait up to that
    ///   long; a real broker answers as soon as a record arrives. 2 ms costs the idle service and the
    ///   development broker a few percent of a core each.
    /// - `max.in.flight`: the mock checks no sequence numbers of an idempotent producer. With five in flight, a
    ///   request it answered with an error while later ones of the same partition were in flight was reported
    ///   delivered without its records ever reaching the log (`test_produce_timeouts_while_events_stream_in_lose_no_job`
    ///   with five: 15–19 of 3,600 jobs lost); a retry landing behind later requests would also break the order
    ///   the output marks need (docs/exactly-once.md). A real broker refuses the later requests until the
    ///   failed one is in. One request at a time keeps every output, in the order sent. It costs latency here:
    ///   librdkafka 2.0.2 puts one partition in a produce request, so a batch's 64 partitions take turns
    ///   (steady load, four pairs: p99 25 against 16 ms with five in flight).
    static let developmentBrokerConsumer = ["fetch.wait.max.ms": "2"]
    /// The config topics' consumer waits longer: between catch-ups it only prefetches, and a fetch every 2 ms
    /// over every config partition was 2–3% of the service's CPU under a steady load (64 + 64 partitions). A
    /// config record published while such a fetch is held reaches the next catch-up up to 20 ms later.
    static let developmentBrokerConfigConsumer = ["fetch.wait.max.ms": "20"]
    static let developmentBrokerProducer = ["max.in.flight": "1"]

    /// The group member's settings: the consumers', with the group's timings unless set with `-X`.
    var groupMemberKafka: KafkaConfiguration {
        kafka.withDefaults(group?.memberProperties ?? [:])
    }

    /// The events consumer's settings (and the state topic reader's).
    func consumerKafka(developmentBroker: Bool) -> KafkaConfiguration {
        kafka.withDefaults(developmentBroker ? Self.developmentBrokerConsumer : [:])
    }

    /// The config topics' consumer settings: the consumers', with its own wait on the development broker.
    func configConsumerKafka(developmentBroker: Bool) -> KafkaConfiguration {
        kafka.withDefaults(developmentBroker ? Self.developmentBrokerConfigConsumer : [:])
    }

    /// The service's producer settings: `producerKafka`, no linger, and the development broker's settings.
    func producerKafka(developmentBroker: Bool) -> KafkaConfiguration {
        // A batch's outputs are enqueued together and then awaited: lingering would only delay them (records
        // enqueued while a request is in flight still travel together in the next one). Idempotence keeps
        // several requests in flight in order on a real broker; the development broker gets one at a time.
        producerKafka.withDefaults(["linger.ms": "0"]).withDefaults(developmentBroker ? Self.developmentBrokerProducer : [:])
    }

    /// The state topic's producer settings: the service producer's, but on the development broker with librdkafka's
    /// own requests in flight (five, with idempotence) rather than one. The mock's loss (`max.in.flight` above) needs
    /// an errored request followed by another of the same partition in flight, which the state writes hardly make:
    /// one write of batch records at a time with one record per partition (`BatchStatePublisher`), checkpoints only
    /// after its acknowledgements, a takeover's claims one per partition, none of them for a partition owned
    /// meanwhile. Only a tombstone or a replay's progress written beside a batch record of the same partition, or a
    /// takeover's write of records a crash left unwritten, could, and only with errors injected. Such a lost record
    /// is one that never landed: a successor starts from the state before it and reads back what came after (a lost
    /// tombstone leaves a record compaction keeps). The writes are a produce request per partition, four times a
    /// second over every owned partition; with one in flight each waited for the one before it, and a group member
    /// spent about 2% more CPU per job under the steady load (group against group, side by side at 2,533 events/s
    /// each: 0.977 and 0.982 with five, over 8 and 12 pairs).
    var stateProducerKafka: KafkaConfiguration {
        producerKafka.withDefaults(["linger.ms": "0"])
    }

    /// The producer's settings: a failed delivery must be final before `deliveryTimeout` ends, so that the
    /// read-back after it sees everything that will ever land (docs/exactly-once.md).
    var producerKafka: KafkaConfiguration {
        // In a fleet, how long a replaced owner's queued outputs may still leave bounds how long a new owner
        // waits before reading back (PartitionLeases.takeoverWait): short, unless set.
        kafka.withDefaults(["message.timeout.ms": group.map { "\($0.messageTimeout.milliseconds)" } ?? "30000"])
    }

    /// The largest record the producer takes (`message.max.bytes`, librdkafka's default unless set with `-X`).
    var maxOutputRecordBytes: Int { Int(producerKafka.properties["message.max.bytes"] ?? "") ?? 1_000_000 }

    /// The producer's `message.timeout.ms` in effect.
    var messageTimeout: Duration { .milliseconds(Int(producerKafka.properties["message.timeout.ms"] ?? "") ?? 30_000) }

    /// How long one produce of a batch waits for its delivery reports: longer than the producer's
    /// `message.timeout.ms` (however it is set), so every report has arrived by then.
    var deliveryTimeout: Duration { messageTimeout + .seconds(15) }
}

extension PipelineConfiguration {
    /// Why `-X key=value` may not be given, or nil: librdkafka properties the guarantees rest on
    /// (docs/exactly-once.md), which would otherwise be changed without a word.
    public static func whyPropertyIsFixed(_ key: String, _ value: String) -> String? {
        switch key {
        case "enable.idempotence" where value.lowercased() != "true":
            "exactly-once needs the idempotent producer: without it a retried request can land twice or out of order"
        case "transactional.id":
            "mailpush's producers are idempotent, not transactional: the broker would refuse every record, forever"
        case "auto.offset.reset":
            "a stored offset outside the log must stop the service, not skip or re-read events without a word; "
                + "--start-from chooses where a partition without a stored offset starts"
        default: nil
        }
    }
}

extension KafkaConfiguration {
    /// These settings, with `defaults` added for each property not set explicitly (with `-X`).
    func withDefaults(_ defaults: [String: String]) -> KafkaConfiguration {
        var configuration = self
        configuration.properties.merge(defaults) { explicit, _ in explicit }
        return configuration
    }
}
