import MailpushKafka
import MailpushState

/// Why the pipeline stopped; the command line maps these to exit codes.
public enum PipelineError: Error, CustomStringConvertible {
    /// The broker did not answer at start-up within the configured time (exit 69).
    case brokerUnreachable(String)
    /// A setting librdkafka refuses, such as an unknown `-X` property (exit 64).
    case invalidConfiguration(String)
    /// The cluster refused this client access while doing `what` (exit 64): retrying cannot help until an operator
    /// grants it (ACLs) or fixes the credentials.
    case accessDenied(what: String, KafkaError)
    /// The state store failed: nothing more can be committed safely (exit 70).
    case state(StateError)
    /// A non-retriable Kafka failure while doing `what` (exit 70; a restart recovers).
    case kafka(what: String, KafkaError)
    /// The broker did something this process cannot go on from (exit 70).
    case inconsistentBroker(String)
    /// An output refused for good whose dead letter is refused too: nothing can be committed for it (exit 70).
    case undeliverable(String)
    case recoveryStalled(String)

    public var description: String {
        switch self {
        case .brokerUnreachable(let detail): "broker unreachable: \(detail)"
        case .invalidConfiguration(let detail): detail
        case .accessDenied(let what, let error):
            "Kafka refused access while \(what): \(error); grant this client's principal access to the topic or group (Kafka ACLs) or fix its credentials"
        case .state(let error): error.description
        case .kafka(let what, let error): "Kafka: \(what): \(error)"
        case .inconsistentBroker(let detail): "Kafka: \(detail)"
        case .undeliverable(let detail): "Kafka: \(detail)"
        case .recoveryStalled(let detail): detail
        }
    }
}

extension PipelineError {
    public var isAccessDenied: Bool {
        if case .accessDenied = self { true } else { false }
    }

    /// Client creation fails only on settings librdkafka refuses: that is the operator's to fix, not a fault.
    static func creatingClient<T>(_ make: () throws(KafkaError) -> T) throws(PipelineError) -> T {
        do {
            return try make()
        } catch {
            throw .invalidConfiguration("Kafka client settings (-X / MAILPUSH_KAFKA_*): \(error)")
        }
    }
}
