import MailpushKafka
import Testing

@testable import MailpushPipeline

@Suite struct TopicPlanTests {
    let topics = Topics()
    var fleet: [TopicRequirement] { topics.requirements(includingState: true) }

    /// Every topic present with `count` partitions.
    func counts(_ count: Int, except missing: Set<String> = []) -> [String: Int] {
        Dictionary(uniqueKeysWithValues: topics.all.filter { !missing.contains($0) }.map { ($0, count) })
    }

    /// What a broker reports: every topic with Kafka's default policy, the three that must be compacted compacted,
    /// then `overrides`.
    func configs(_ overrides: [String: String] = [:]) -> ObservedConfigs {
        var described: [String: [String: String]] = [:]
        for topic in topics.all { described[topic] = ["cleanup.policy": "delete", "retention.ms": "604800000"] }
        for topic in [topics.devices, topics.addressKeys, topics.state] { described[topic]!["cleanup.policy"] = "compact" }
        for (topic, policy) in overrides { described[topic]!["cleanup.policy"] = policy }
        return .known(described)
    }

    func plan(_ counts: [String: Int], _ configs: ObservedConfigs, requirements: [TopicRequirement]? = nil) -> TopicPlan {
        TopicPlan(requirements: requirements ?? fleet, partitionCounts: counts, configs: configs, partitions: 12, replicationFactor: 3)
    }

    @Test func wellConfiguredTopicsNeedNothing() {
        let plan = plan(counts(8), configs())
        #expect(plan.toCreate.isEmpty)
        #expect(plan.problems.isEmpty)
        #expect(plan.configsUnchecked == nil)
        #expect(plan.startupVerdict == .proceed)
        #expect(plan.entries.map(\.action) == Array(repeating: .exists(partitions: 8), count: 6))
        #expect(plan.entries.map(\.cleanupPolicy) == ["delete", "compact", "compact", "delete", "delete", "compact"])
    }

    @Test func missingTopicsAreCreatedWithTheRequestedSettingsAndAnExplicitPolicy() {
        let plan = plan([:], .known([:]))
        #expect(
            plan.toCreate == [
                NewTopic(name: "email.received", partitions: 12, replicationFactor: 3, configs: ["cleanup.policy": "delete"]),
                NewTopic(name: "mailpush.devices", partitions: 12, replicationFactor: 3, configs: ["cleanup.policy": "compact"]),
                NewTopic(name: "mailpush.address-keys", partitions: 12, replicationFactor: 3, configs: ["cleanup.policy": "compact"]),
                NewTopic(name: "mailpush.push-jobs", partitions: 12, replicationFactor: 3, configs: ["cleanup.policy": "delete"]),
                NewTopic(name: "mailpush.dead-letters", partitions: 12, replicationFactor: 3, configs: ["cleanup.policy": "delete"]),
                NewTopic(name: "mailpush.state", partitions: 12, replicationFactor: 3, configs: ["cleanup.policy": "compact"]),
            ])
        #expect(plan.problems.isEmpty)
        #expect(plan.configsUnchecked == nil, "nothing exists whose policy could be unknown")
    }

    @Test func aNewStateTopicGetsAsManyPartitionsAsTheExistingEventsTopic() {
        var present = counts(4, except: [topics.state])
        present[topics.events] = 24
        let plan = plan(present, configs())
        #expect(plan.toCreate.map(\.name) == [topics.state])
        #expect(plan.toCreate.first?.partitions == 24)
        // Fewer events partitions than asked for: the state topic still gets what was asked.
        #expect(self.plan(counts(4, except: [topics.state]), configs()).toCreate.first?.partitions == 12)
    }

    @Test(arguments: [
        ("mailpush.devices", "delete", "--devices-topic", "registrations older than retention.ms would vanish"),
        ("mailpush.address-keys", "compact,delete", "--keys-topic", "address keys older than retention.ms would vanish"),
        ("mailpush.state", "delete", "--state-topic", "the state of a partition untouched for retention.ms would vanish"),
    ])
    func aTopicThatMustBeCompactedAndIsNotIsRefused(topic: String, policy: String, option: String, why: String) {
        let plan = plan(counts(4), configs([topic: policy]))
        let message = "topic \(topic) has cleanup.policy=\(policy); it must be compact (\(why))"
        #expect(plan.problems.map(\.message) == [message])
        #expect(plan.problems.first?.setting == "cleanup.policy")
        #expect(plan.problems.first?.fix.contains("--entity-name \(topic) --add-config cleanup.policy=compact") == true)
        guard case .refuse(let refusal) = plan.startupVerdict else {
            Issue.record("expected a refusal, got \(plan.startupVerdict)")
            return
        }
        #expect(refusal.hasPrefix("\(option): \(message); to fix: kafka-configs.sh"))
        #expect(plan.toCreate.isEmpty, "an existing topic is never altered or re-created")
    }

    @Test func everyProblemIsNamedInTheRefusal() {
        let plan = plan(counts(4), configs([topics.devices: "delete", topics.addressKeys: "delete"]))
        guard case .refuse(let refusal) = plan.startupVerdict else {
            Issue.record("expected a refusal, got \(plan.startupVerdict)")
            return
        }
        #expect(refusal.contains("topic mailpush.devices has cleanup.policy=delete"))
        #expect(refusal.contains("topic mailpush.address-keys has cleanup.policy=delete"))
    }

    @Test func theOtherTopicsMayHaveAnyPolicy() {
        let plan = plan(counts(4), configs([topics.events: "compact", topics.jobs: "compact", topics.deadLetters: "compact"]))
        #expect(plan.problems.isEmpty)
        #expect(plan.startupVerdict == .proceed)
    }

    @Test func aPolicyTheBrokerLeavesOutIsKafkasDefaultDelete() {
        let plan = plan(counts(4), .known(Dictionary(uniqueKeysWithValues: topics.all.map { ($0, ["retention.ms": "1"]) })))
        #expect(plan.problems.map(\.topic) == [topics.devices, topics.addressKeys, topics.state])
    }

    @Test func aStateTopicWithFewerPartitionsThanTheEventsTopicIsRefused() {
        var present = counts(8)
        present[topics.state] = 6
        let plan = plan(present, configs())
        #expect(
            plan.problems.map(\.message) == [
                "topic mailpush.state has 6 partitions; it must have at least as many as email.received (8): the state of event partition p lives in its partition p"
            ])
        #expect(plan.problems.first?.setting == "partitions")
        #expect(plan.problems.first?.fix == "kafka-topics.sh --bootstrap-server B --alter --topic mailpush.state --partitions 8")
        guard case .refuse(let refusal) = plan.startupVerdict else {
            Issue.record("expected a refusal, got \(plan.startupVerdict)")
            return
        }
        #expect(refusal.hasPrefix("--state-topic: topic mailpush.state has 6 partitions"))
        // More state partitions than event partitions is fine.
        present[topics.state] = 10
        #expect(self.plan(present, configs()).startupVerdict == .proceed)
    }

    @Test func aBrokerThatCannotAnswerLeavesThePoliciesUncheckedAndTheRunProceeds() {
        let plan = plan(counts(4), .unknown("the broker does not answer DescribeConfigs"))
        #expect(plan.problems.isEmpty)
        #expect(plan.entries.allSatisfy { $0.cleanupPolicy == nil })
        #expect(plan.configsUnchecked == "the broker does not answer DescribeConfigs")
        #expect(plan.startupVerdict == .proceedUnchecked("the broker does not answer DescribeConfigs"))
    }

    @Test func partitionsAreCheckedEvenWhenThePoliciesCannotBe() {
        var present = counts(4)
        present[topics.state] = 2
        let plan = plan(present, .unknown("cannot tell"))
        guard case .refuse(let refusal) = plan.startupVerdict else {
            Issue.record("expected a refusal, got \(plan.startupVerdict)")
            return
        }
        #expect(refusal.contains("topic mailpush.state has 2 partitions"))
    }

    @Test func anAnswerThatLeavesOutATopicToCheckIsNotTakenForCompacted() {
        guard case .known(var described) = configs() else { return }
        described[topics.devices] = nil
        let plan = plan(counts(4), .known(described))
        #expect(plan.problems.isEmpty)
        #expect(plan.startupVerdict == .proceedUnchecked("the broker's answer left out mailpush.devices"))
    }

    @Test func aMissingStateTopicRefusesTheRun() {
        let plan = plan(counts(4, except: [topics.state]), configs())
        #expect(
            plan.startupVerdict
                == .refuse(
                    "--state-topic: topic mailpush.state does not exist; create it with at least 4 partitions (as many as email.received) and cleanup.policy=compact (`mailpush topics` does)"
                ))
    }

    @Test func staticOwnershipDoesNotCheckTheStateTopic() {
        let requirements = topics.requirements(includingState: false)
        #expect(!requirements.map(\.name).contains(topics.state))
        // Missing, deleting and with fewer partitions: none of it matters to an instance that never uses it.
        var present = counts(8, except: [topics.state])
        #expect(plan(present, configs(), requirements: requirements).startupVerdict == .proceed)
        present[topics.state] = 2
        #expect(plan(present, configs([topics.state: "delete"]), requirements: requirements).startupVerdict == .proceed)
        // The other checks still hold.
        #expect(
            plan(present, configs([topics.devices: "delete"]), requirements: requirements).problems.map(\.topic) == [topics.devices])
    }

    @Test func renamedTopicsAreNamedAndCheckedByTheirNames() {
        var renamed = Topics()
        renamed.devices = "acme.devices"
        renamed.state = "acme.state"
        var present = Dictionary(uniqueKeysWithValues: renamed.all.map { ($0, 4) })
        present[renamed.state] = nil
        let plan = TopicPlan(
            requirements: renamed.requirements(includingState: true), partitionCounts: present,
            configs: .known(["acme.devices": ["cleanup.policy": "delete"]]), partitions: 6, replicationFactor: 1)
        #expect(
            plan.toCreate == [NewTopic(name: "acme.state", partitions: 6, replicationFactor: 1, configs: ["cleanup.policy": "compact"])])
        #expect(plan.problems.map(\.topic) == ["acme.devices"])
    }
}
