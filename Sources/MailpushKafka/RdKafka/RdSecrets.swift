import Foundation

/// librdkafka properties whose values must never appear in a message: credentials reach mailpush through the
/// environment (a Kubernetes Secret), and an error line ends up in logs that many people can read.
enum RdSecrets {
    static let markers = ["password", "secret", "token", "jaas", "key", "credential", "sasl.oauthbearer.config"]

    static func isSecret(_ property: String) -> Bool {
        let lowered = property.lowercased()
        return markers.contains { lowered.contains($0) }
    }

    /// `text` with every occurrence of a secret property's value hidden.
    static func redact(_ text: String, property: String, value: String) -> String {
        guard isSecret(property), !value.isEmpty else { return text }
        return text.replacingOccurrences(of: value, with: "<redacted>")
    }

    /// How a property is named in an error: with its value, unless the value is a secret.
    static func describe(property: String, value: String) -> String {
        isSecret(property) ? "\(property) (value hidden)" : "\(property)=\(value)"
    }
}
