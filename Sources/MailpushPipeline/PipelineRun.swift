import Foundation
import Logging
import MailpushKafka
import MailpushPartition
import MailpushState

/// The mutable state of one run, owned by the single task that runs the loop.
struct PipelineRun {
    let pipeline: Pipeline
    let cluster: KafkaCluster
    let processor: BatchProcessor
    let events: KafkaConsumer
    var config: ConfigFollower
    var delivery: OutputDelivery
    var recovery = Recovery()
    var housekeeping = Housekeeping()
    var replays = ServiceReplays()
    /// Group ownership's membership, state writer and leases; nil with static ownership.
    var fleet: Fleet?

    /// The event partitions processed now: fixed with static ownership, moving with a fleet's rebalances.
    var ownedEventPartitions: [TopicPartition]
    /// Next offset to commit per event partition (what the state store holds).
    var committed: [TopicPartition: Int64]

    var logger: Logger { pipeline.logger }
    var store: StateStore { pipeline.store }
    var metrics: PipelineMetrics { pipeline.metrics }
    var health: HealthState { pipeline.health }
    var timeout: Duration { pipeline.configuration.kafkaRequestTimeout }

    func close() {
        fleet?.inbox.close()
        events.close()
        config.close()
        replays.active?.consumer.close()
    }

    /// Retries `body` with capped exponential backoff while Kafka or the network fails, reporting unready meanwhile.
    /// Returns false if `shouldStop` turned true before it succeeded (the work is left to recovery).
    @discardableResult
    mutating func retrying(
        _ what: String, until shouldStop: @Sendable () -> Bool = { false },
        _ body: (inout PipelineRun) async throws -> Void
    ) async throws -> Bool {
        var attempt = 0
        while true {
            do {
                try await body(&self)
                return true
            } catch let error as PipelineError {
                throw error
            } catch let error as OwnershipLost {
                throw error
            } catch let error as StateError {
                throw PipelineError.state(error)
            } catch let error as KafkaError where error.isAccessDenied {
                throw PipelineError.accessDenied(what: what, error)
            } catch let error as KafkaError where error.isFatal {
                throw PipelineError.kafka(what: what, error)
            } catch is CancellationError {
                throw CancellationError()
            } catch {
                if shouldStop() { return false }
                try await pipeline.backoff(&attempt, what, error)
                if shouldStop() { return false }
            }
        }
    }
}
