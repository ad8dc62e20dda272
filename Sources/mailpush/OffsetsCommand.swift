import ArgumentParser
import Foundation
import Logging
import MailpushCore
import MailpushKafka
import MailpushPartition
import MailpushPipeline
import MailpushState

struct OffsetsCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "offsets",
        abstract: "Show or set the input offsets: the state directory's, and with --brokers the fleet's in the state topic.",
        discussion: """
            Without --set, lists every stored offset (with the broker's end and the lag when --brokers is given). \
            With --brokers it also shows the fleet, from the state topic: every event partition's committed offset, \
            end, lag, owner (host and instance id), ownership epoch, and whether it is owned, released, moving, or \
            owned by a newer mailpush whose state records this version cannot read (newer).

            --set TOPIC:PARTITION=VALUE (repeatable), PARTITION a number or * for all, VALUE one of: an offset (the \
            next record to read), earliest, latest, or @TIME (epoch ms or ISO 8601). earliest, latest, @TIME and * \
            ask the broker (--brokers). --set needs the state directory to itself: while `mailpush run` (or a \
            replay) holds it, it exits with status 75; stop the service first.

            In a fleet (found from the state topic, with --brokers) --set moves the events topic's partitions \
            through the state topic instead, with the fleet running or stopped: each partition's owner continues at \
            the offset set within a lease renewal, and a partition nobody owns continues there when it is claimed. \
            The state directory is not touched then.
            """)

    @OptionGroup var state: StateOptions
    @OptionGroup var topicOptions: TopicOptions
    @Option(help: "Kafka bootstrap servers, for earliest/latest/@TIME, * and lag, and the fleet's view.") var brokers: String?
    @Option(help: "The fleet's state topic (shown with --brokers).") var stateTopic = Topics().state
    @Option(name: .customShort("X"), help: ArgumentHelp("A librdkafka property, key=value.", valueName: "key=value")) var kafkaProperties:
        [String] = []
    @Option(name: .customLong("set"), help: ArgumentHelp("TOPIC:PARTITION=VALUE", valueName: "assignment")) var assignments: [String] = []

    struct Assignment {
        var topic: String
        var partition: Int32?
        var value: String
    }

    func parsed() throws -> [Assignment] {
        try assignments.map { text in
            guard let equals = text.lastIndex(of: "="), let colon = text[..<equals].lastIndex(of: ":") else {
                throw ValidationError("--set \(text): expected TOPIC:PARTITION=VALUE")
            }
            let topic = String(text[..<colon])
            let partitionText = String(text[text.index(after: colon)..<equals])
            let value = String(text[text.index(after: equals)...])
            guard !topic.isEmpty else { throw ValidationError("--set \(text): topic is empty") }
            // A mistyped topic would be stored and never read: the service reads only these.
            let inputs = topicOptions.topics
            guard [inputs.events, inputs.devices, inputs.addressKeys].contains(topic) else {
                throw ValidationError(
                    "--set \(text): \(quotedForError(topic)) is not an input topic; offsets are kept for \(inputs.events), "
                        + "\(inputs.devices) and \(inputs.addressKeys) (named by --events-topic, --devices-topic, --keys-topic)")
            }
            let partition: Int32?
            if partitionText == "*" {
                partition = nil
            } else if let number = Int32(partitionText), number >= 0 {
                partition = number
            } else {
                throw ValidationError("--set \(text): partition \"\(partitionText)\" is not a number or *")
            }
            let valid =
                value == "earliest" || value == "latest" || (Int64(value).map { $0 >= 0 } ?? false)
                || (value.hasPrefix("@") && TimeArgument.epochMilliseconds(String(value.dropFirst())) != nil)
            guard valid else { throw ValidationError("--set \(text): value \"\(value)\" is not an offset, earliest, latest or @TIME") }
            return Assignment(topic: topic, partition: partition, value: value)
        }
    }

    func validate() throws {
        let list = try parsed()
        if brokers == nil, let needing = list.first(where: { $0.partition == nil || Int64($0.value) == nil }) {
            throw ValidationError("--set \(needing.topic):\(needing.partition.map(String.init) ?? "*")=\(needing.value) needs --brokers")
        }
    }

    func run() async throws {
        var kafka: KafkaConfiguration?
        let cluster: KafkaCluster? = try brokers.map { brokers in
            var properties: [String: String] = [:]
            for property in kafkaProperties {
                let parts = property.split(separator: "=", maxSplits: 1)
                guard parts.count == 2 else {
                    throw fail("-X: expected key=value, got an argument without \"=\" (not shown: it may hold a secret)", ExitStatus.usage)
                }
                properties[String(parts[0])] = String(parts[1])
            }
            kafka = KafkaConfiguration(bootstrapServers: brokers, properties: properties)
            do {
                return try KafkaCluster(configuration: kafka!)
            } catch {
                throw fail("Kafka client settings (-X): \(error)", ExitStatus.usage)
            }
        }
        let list = try parsed()
        do {
            if !list.isEmpty, let kafka, let cluster,
                try await FleetView.isFleet(
                    kafka: kafka, eventsTopic: topicOptions.topics.events, stateTopic: stateTopic, timeout: .seconds(10))
            {
                try await setInFleet(list, kafka, cluster)
                return
            }
            if list.isEmpty, !state.exists {
                // Listing never creates a state directory: a mistyped --state-dir would otherwise become a new,
                // empty one that looks like a service that stored nothing.
                print("no state at \(state.stateDir): nothing stored here (`mailpush run` creates it)")
                if let kafka { try await showFleet(kafka) }
                return
            }
            let store = try state.open()
            // Setting offsets under a running service would be overwritten at its next commit: refuse instead.
            let lock = list.isEmpty ? nil : try state.lock("stop `mailpush run` before setting offsets")
            defer { withExtendedLifetime(lock) {} }
            if list.isEmpty {
                try await show(store, cluster)
                if let kafka { try await showFleet(kafka) }
            } else {
                try await set(list, store, cluster)
            }
        } catch let error as ExitCode {
            throw error
        } catch let error as StateError {
            throw fail("\(error)", ExitStatus.software)
        } catch {
            throw fail("broker: \(error)", ExitStatus.unavailable)
        }
    }

    private func show(_ store: StateStore, _ cluster: KafkaCluster?) async throws {
        let offsets = try store.offsets().sorted { $0.key < $1.key }
        guard !offsets.isEmpty else {
            print("no offsets stored in \(store.path)")
            return
        }
        var ends: [TopicPartition: Int64] = [:]
        if let cluster {
            ends = try await cluster.endOffsets(offsets.map(\.key), timeout: .seconds(10))
        }
        let width = max(5, offsets.map(\.key.topic.count).max() ?? 0)
        print(
            "TOPIC".padding(toLength: width, withPad: " ", startingAt: 0) + "  PARTITION  NEXT-OFFSET"
                + (cluster == nil ? "" : "  END-OFFSET  LAG"))
        for (key, offset) in offsets {
            var line =
                key.topic.padding(toLength: width, withPad: " ", startingAt: 0)
                + "  " + String(key.partition).leftPad(9) + "  " + String(offset).leftPad(11)
            if let end = ends[key] {
                line += "  " + String(end).leftPad(10) + "  " + String(max(0, end - offset))
            }
            print(line)
        }
    }

    private func showFleet(_ kafka: KafkaConfiguration) async throws {
        let events = topicOptions.topics.events
        let partitions = try await FleetView.read(kafka: kafka, eventsTopic: events, stateTopic: stateTopic, timeout: .seconds(10))
        guard partitions.contains(where: { $0.owner != nil }) else {
            print("\nfleet: no partition state in \(stateTopic) (no instance of a group has processed \(events) yet)")
            return
        }
        let cluster = try KafkaCluster(configuration: kafka)
        let ends = try await cluster.endOffsets(
            partitions.map { TopicPartition(topic: events, partition: $0.partition) }, timeout: .seconds(10))
        print("\nfleet (\(events), state in \(stateTopic))")
        print("PARTITION  NEXT-OFFSET  END-OFFSET  LAG  EPOCH  STATE     OWNER")
        for entry in partitions {
            let end = ends[TopicPartition(topic: events, partition: entry.partition)]
            let offset = entry.offset.map(String.init) ?? "-"
            let lag = zip2(entry.offset, end).map { String(max(0, $1 - $0)) } ?? "-"
            let state =
                entry.newerFormat != nil
                ? "newer" : entry.moving ? "moving" : entry.owner == nil ? "unowned" : entry.released ? "released" : "owned"
            let owner = entry.owner.map { "\(entry.host ?? "?") (\($0.prefix(8)))" } ?? "-"
            print(
                String(entry.partition).leftPad(9) + "  " + offset.leftPad(11) + "  " + (end.map(String.init) ?? "-").leftPad(10)
                    + "  " + lag.leftPad(3) + "  " + (entry.epoch < 0 ? "-" : String(entry.epoch)).leftPad(5) + "  "
                    + state.padding(toLength: 8, withPad: " ", startingAt: 0) + "  " + owner)
        }
        if partitions.contains(where: \.moving) {
            print("moving: `offsets --set` asked the fleet to continue there; the partition's next claim takes it up")
        }
        if let format = partitions.compactMap(\.newerFormat).max() {
            print(
                "newer: a newer mailpush owns it, with state records of format \(format), which this version cannot read "
                    + "(its offset here is the last of this version's); run that version's `mailpush offsets` to see it")
        }
    }

    private func set(_ list: [Assignment], _ store: StateStore, _ cluster: KafkaCluster?) async throws {
        let wanted = try await resolve(list, cluster)
        let previous = try store.setOffsets(wanted)
        for key in wanted.keys.sorted() {
            let before = previous[key].flatMap { $0 }.map(String.init) ?? "unset"
            print("\(key.topic)/\(key.partition): \(before) -> \(wanted[key]!)")
        }
    }

    /// In a fleet: position requests in the state topic, then a short wait for owned partitions' owners to take
    /// them up (a stopped or crashed owner never does; the next claim will).
    private func setInFleet(_ list: [Assignment], _ kafka: KafkaConfiguration, _ cluster: KafkaCluster) async throws {
        let topics = topicOptions.topics
        if let other = list.first(where: { $0.topic != topics.events }) {
            throw fail(
                "--set \(other.topic):…: in a fleet only \(topics.events)'s offsets move, through \(stateTopic); the "
                    + "offsets of \(other.topic) are each member's own (set them with the member stopped and its --state-dir, "
                    + "without --brokers for a plain offset)", ExitStatus.usage)
        }
        let wanted = try await resolve(list, cluster)
        let count = try await cluster.partitionCount(topic: topics.events, timeout: .seconds(10)) ?? 0
        if let missing = wanted.keys.first(where: { $0.partition >= count }) {
            throw fail("--set: \(topics.events) has no partition \(missing.partition) (it has \(count))", ExitStatus.usage)
        }
        let before = try await FleetView.read(kafka: kafka, eventsTopic: topics.events, stateTopic: stateTopic, timeout: .seconds(10))
        var all = topics
        all.state = stateTopic
        let offsets = Dictionary(uniqueKeysWithValues: wanted.map { ($0.key.partition, $0.value) })
        let landed = try await FleetView.requestPositions(
            kafka: kafka, topics: all, offsets: offsets, requestedBy: UUID().uuidString.lowercased(),
            host: ProcessInfo.processInfo.hostName, timeout: .seconds(10))
        for (partition, offset) in offsets.sorted(by: { $0.key < $1.key }) {
            let previous = before.first { $0.partition == partition }?.offset.map(String.init) ?? "unset"
            print("\(topics.events)/\(partition): \(previous) -> \(offset) (fleet, through \(stateTopic))")
        }
        // An owner takes its request up within a lease renewal and a batch; released or unowned partitions wait
        // for their next claim, and so does a partition whose owner died.
        let owned = Set(before.filter { $0.owner != nil && !$0.released }.map(\.partition)).intersection(offsets.keys)
        var waiting = owned
        let deadline = ContinuousClock.now + Self.takeUpWait
        while !waiting.isEmpty, ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(500))
            waiting.subtract(
                try await FleetView.positionsTakenUp(
                    kafka: kafka, stateTopic: stateTopic, eventsTopic: topics.events, landed: landed.filter { waiting.contains($0.key) },
                    timeout: .seconds(10)))
        }
        let taken = owned.subtracting(waiting)
        if !taken.isEmpty { print("taken up by their owners: partitions \(taken.sorted())") }
        let later = Set(offsets.keys).subtracting(taken)
        if !later.isEmpty {
            print(
                "partitions \(later.sorted()): no running owner took the request up yet; each continues at its offset when a "
                    + "member claims it (`mailpush offsets --brokers …` shows them as moving until then)")
        }
    }

    static let takeUpWait = Duration.seconds(15)

    /// The offsets `list` asks for, earliest/latest/@TIME and * asked of the broker.
    private func resolve(_ list: [Assignment], _ cluster: KafkaCluster?) async throws -> [TopicPartition: Int64] {
        var wanted: [TopicPartition: Int64] = [:]
        for assignment in list {
            if assignment.partition != nil, let offset = Int64(assignment.value) {
                wanted[TopicPartition(topic: assignment.topic, partition: assignment.partition!)] = offset
                continue
            }
            guard let cluster else { throw fail("--set needs --brokers for \(assignment.value)", ExitStatus.usage) }
            var partitions: [TopicPartition]
            if let partition = assignment.partition {
                partitions = [TopicPartition(topic: assignment.topic, partition: partition)]
            } else {
                guard let count = try await cluster.partitionCount(topic: assignment.topic, timeout: .seconds(10)) else {
                    throw fail("--set: topic \(assignment.topic) does not exist", ExitStatus.usage)
                }
                partitions = (0..<Int32(count)).map { TopicPartition(topic: assignment.topic, partition: $0) }
            }
            let resolved: [TopicPartition: Int64]
            switch assignment.value {
            case "earliest": resolved = try await cluster.beginningOffsets(partitions, timeout: .seconds(10))
            case "latest": resolved = try await cluster.endOffsets(partitions, timeout: .seconds(10))
            case let value where value.hasPrefix("@"):
                resolved = try await cluster.offsets(
                    forTimestampMs: TimeArgument.epochMilliseconds(String(value.dropFirst()))!, partitions, timeout: .seconds(10))
            default:
                resolved = Dictionary(uniqueKeysWithValues: partitions.map { ($0, Int64(assignment.value)!) })
            }
            for (partition, offset) in resolved { wanted[partition] = offset }
        }
        return wanted
    }
}

private func zip2<A, B>(_ a: A?, _ b: B?) -> (A, B)? {
    guard let a, let b else { return nil }
    return (a, b)
}

extension String {
    func leftPad(_ width: Int) -> String {
        count >= width ? self : String(repeating: " ", count: width - count) + self
    }
}
