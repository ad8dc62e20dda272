/// Why an event goes to the dead-letter topic. The raw value is the `reason` label of
/// `mailpush_dead_letters_total` and of the dead-letter log line; the `mailpush-error` header carries the
/// one-line detail a person acts on (README, "Metrics", lists these labels).
public enum DeadLetterReason: String, CaseIterable, Sendable {
    case invalidJSON = "invalid_json"
    case missingField = "missing_field"
    case invalidField = "invalid_field"
    case unsupportedType = "unsupported_type"
    /// A device that needs a sealed payload, and no key for the address.
    case noKey = "no_key"
    /// A device that needs a sealed payload, and the address's key was rejected.
    case unusableKey = "unusable_key"
    /// Even shortened, the payload exceeds the push limit.
    case tooLarge = "too_large"
    /// Any other rendering or sealing failure.
    case renderFailed = "render_failed"
    /// The broker refused a job for good (too large, invalid record, topic not authorized).
    case rejected = "rejected"
}
