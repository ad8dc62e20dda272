/// Gives every documented long option an environment variable, `MAILPUSH_<OPTION>` (CONTRACT §9): a value set
/// in the environment is used when the command line does not set the option itself. librdkafka properties come
/// from `MAILPUSH_KAFKA_<PROPERTY>`, dots written as underscores, and are added as `-X` options.
///
/// The table is explicit on purpose: an earlier version read the options by reflection and silently missed
/// option groups (`--log-level` and `--log-format` did nothing from the environment). A test in
/// tests/integration/test_environment.py sets every variable of the README's table and observes its effect.
enum EnvironmentArguments {
    static let prefix = "MAILPUSH_"
    static let kafkaPrefix = "MAILPUSH_KAFKA_"

    enum Kind {
        /// Text: an empty value means "unset".
        case text
        /// A number: an empty value (a missing pod-index label, say) is passed on so the parser reports it by
        /// name instead of using a silent default.
        case number
        /// A boolean flag: `1`, `true`, `yes` or `on` sets it.
        case flag
    }

    typealias Setting = (option: String, kind: Kind)

    static let broker: [Setting] = [("brokers", .text), ("startup-timeout-seconds", .number)]
    static let state: [Setting] = [("state-dir", .text)]
    static let topics: [Setting] = [
        ("events-topic", .text), ("devices-topic", .text), ("keys-topic", .text), ("jobs-topic", .text),
        ("dead-letter-topic", .text),
    ]
    static let render: [Setting] = [
        ("sponsor-webhook-url", .text), ("alert-title", .text), ("alert-body", .text), ("ttl-seconds", .number),
        ("dedupe-window-seconds", .number), ("rsa-multi-buffer", .text),
    ]
    static let logging: [Setting] = [("log-level", .text), ("log-format", .text)]

    /// Each subcommand's options that the environment may set, and whether it takes `MAILPUSH_KAFKA_*`.
    static let commands: [String: (settings: [Setting], kafka: Bool)] = [
        "run": (
            broker + state + topics + render + logging + [
                ("http-port", .number), ("group", .text), ("group-instance-id", .text), ("group-session-timeout-ms", .number),
                ("state-topic", .text), ("instance", .number), ("instances", .number), ("batch-size", .number),
                ("start-from", .text), ("shutdown-grace-seconds", .number), ("liveness-timeout-seconds", .number),
            ], true
        ),
        "replay": (
            broker + state + topics + render + logging + [
                ("from-offset", .number), ("to-offset", .number), ("from-time", .text), ("to-time", .text),
                ("force", .flag), ("state-topic", .text),
            ], true
        ),
        "topics": (
            broker + topics + logging + [("state-topic", .text), ("partitions", .number), ("replication-factor", .number)], true
        ),
        "offsets": (state + topics + [("brokers", .text), ("state-topic", .text)], true),
        "devbroker": ([("partitions", .number), ("bootstrap-file", .text), ("broker-count", .number)], false),
        "unseal": ([("private-key", .text)], false),
    ]

    /// The command line with the environment's settings added, and which option came from which variable.
    struct Merged {
        var arguments: [String]
        var variables: [(option: String, variable: String)] = []

        /// A line for each option a usage error names that the command line did not set: the person reading the
        /// error set a variable, not the flag it names.
        func notes(for message: String) -> [String] {
            variables.filter { names(message, $0.option) }.map { "(\($0.option) was set by \($0.variable))" }
        }

        private func names(_ message: String, _ option: String) -> Bool {
            var rest = message[...]
            while let range = rest.range(of: option) {
                let next = rest[range.upperBound...].first
                if next.map({ !($0.isLetter || $0.isNumber || $0 == "-") }) ?? true { return true }
                rest = rest[range.upperBound...]
            }
            return false
        }
    }

    static func merge(arguments: [String], environment: [String: String]) -> Merged {
        guard let command = arguments.first, let entry = commands[command],
            // Help is shown whatever the environment holds (a bad value there made `--help` an error).
            !arguments.prefix(while: { $0 != "--" }).contains(where: { $0 == "--help" || $0 == "-h" })
        else { return Merged(arguments: arguments) }
        var added: [String] = []
        var variables: [(option: String, variable: String)] = []
        for (option, kind) in entry.settings {
            let flag = "--\(option)"
            guard !arguments.contains(where: { $0 == flag || $0.hasPrefix(flag + "=") }) else { continue }
            guard let value = environment[environmentName(option)] else { continue }
            let count = added.count
            switch kind {
            case .text:
                if !value.isEmpty { added.append("\(flag)=\(value)") }
            case .number:
                added.append("\(flag)=\(value)")
            case .flag:
                if ["1", "true", "yes", "on"].contains(value.lowercased()) { added.append(flag) }
            }
            if added.count > count { variables.append((flag, environmentName(option))) }
        }
        if entry.kafka {
            for (name, value) in environment.sorted(by: { $0.key < $1.key }) where name.hasPrefix(kafkaPrefix) {
                let property = name.dropFirst(kafkaPrefix.count).lowercased().replacingOccurrences(of: "_", with: ".")
                added += ["-X", "\(property)=\(value)"]
            }
        }
        // Right after the subcommand, so positional arguments and a `--` terminator keep their meaning.
        return Merged(arguments: [command] + added + arguments.dropFirst(), variables: variables)
    }

    static func environmentName(_ option: String) -> String {
        prefix + option.uppercased().replacingOccurrences(of: "-", with: "_")
    }
}
