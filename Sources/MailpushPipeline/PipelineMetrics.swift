import MailpushCore
import Metrics

/// The service's metrics (names are part of the operations guide and the Helm chart's alerts).
/// Handles are made once: swift-metrics looks them up in the factory on every initialisation.
final class PipelineMetrics: Sendable {
    let eventsReceived = Counter(label: "mailpush_events_received_total")
    let duplicateEvents = Counter(label: "mailpush_duplicate_events_total")
    let notificationsFiltered = Counter(label: "mailpush_notifications_filtered_total")
    let invalidFilterRules = Counter(label: "mailpush_invalid_filter_rules_total")
    let webhookWithoutEndpoint = Counter(label: "mailpush_webhook_devices_without_endpoint_total")
    let rejectedKeys = Counter(label: "mailpush_rejected_address_keys_total")
    let deliveryRetries = Counter(label: "mailpush_delivery_retries_total")
    let recoveredOutputs = Counter(label: "mailpush_recovered_outputs_total")
    let expiredDedupeEntries = Counter(label: "mailpush_dedupe_entries_expired_total")
    let dedupeEntries = Gauge(label: "mailpush_dedupe_entries")
    let batchDuration = Timer(label: "mailpush_batch_duration_seconds", preferredDisplayUnit: .seconds)
    let batchSize = Recorder(label: "mailpush_batch_records", aggregate: true)
    /// Each event's age (now minus its Kafka timestamp) when its batch starts being planned: its time on the
    /// broker and in the fetch, the latency the service's own work comes on top of (`make bench` reports it).
    let eventAgeAtPlanning = Timer(label: "mailpush_event_age_at_planning_seconds", preferredDisplayUnit: .seconds)
    // A fleet (group ownership).
    let ownedPartitions = Gauge(label: "mailpush_owned_partitions")
    let rebalances = Counter(label: "mailpush_rebalances_total")
    let partitionsTakenOver = Counter(label: "mailpush_partitions_taken_over_total")
    let partitionsReleased = Counter(label: "mailpush_partitions_released_total")
    let partitionsLost = Counter(label: "mailpush_partitions_lost_total")
    let restoreBytes = Counter(label: "mailpush_state_restore_bytes_total")
    /// Output records a takeover read back (bounded by the last checkpoint of the previous owner).
    let takeoverReadback = Counter(label: "mailpush_takeover_readback_records_total")
    let restoreDuration = Timer(label: "mailpush_state_restore_seconds", preferredDisplayUnit: .seconds)
    /// From the assignment being acted on to processing: restore, claim, lease wait, read-back.
    let takeoverDuration = Timer(label: "mailpush_takeover_seconds", preferredDisplayUnit: .seconds)
    /// How long a batch's (or a replay's) outputs paused for a lease renewal that came late (`PartitionLeases`).
    let leaseWaits = Timer(label: "mailpush_lease_wait_seconds", preferredDisplayUnit: .seconds)

    private let jobsByPlatform: [String: Counter] = Dictionary(
        uniqueKeysWithValues: ["ios", "android", "webhook"].map {
            ($0, Counter(label: "mailpush_jobs_produced_total", dimensions: [("platform", $0)]))
        })

    /// Touches every labelled series once, so dashboards and alerts see zeros before the first event.
    func announce(topics: [String]) {
        for reason in DeadLetterReason.allCases { deadLetter(reason).increment(by: 0) }
        for topic in topics {
            for result in ["applied", "skipped"] { configRecord(topic: topic, result: result).increment(by: 0) }
        }
    }

    func jobsProduced(platform: String) -> Counter {
        jobsByPlatform[platform] ?? Counter(label: "mailpush_jobs_produced_total", dimensions: [("platform", platform)])
    }

    func deadLetter(_ reason: DeadLetterReason) -> Counter {
        Counter(label: "mailpush_dead_letters_total", dimensions: [("reason", reason.rawValue)])
    }

    func configRecord(topic: String, result: String) -> Counter {
        Counter(label: "mailpush_config_records_total", dimensions: [("topic", topic), ("result", result)])
    }

    func lag(topic: String, partition: Int32) -> Gauge {
        Gauge(label: "mailpush_consumer_lag", dimensions: [("topic", topic), ("partition", String(partition))])
    }
}
