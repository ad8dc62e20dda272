/// Why the pipeline stopped; the command line maps these to exit codes.
public enum PipelineError: Error, CustomStringConvertible {
    /// The broker did not answer at start-up within the configured time (exit 69).
    case brokerUnreachable(String)
    /// The state store failed: nothing more can be committed safely (exit 70).
    case state(String)
    /// A non-retriable Kafka failure (exit 70; a restart recovers).
    case kafka(String)
    case recoveryStalled(String)

    public var description: String {
        switch self {
        case .brokerUnreachable(let detail): "broker unreachable: \(detail)"
        case .state(let detail): detail
        case .kafka(let detail): "Kafka: \(detail)"
        case .recoveryStalled(let detail): detail
        }
    }
}
