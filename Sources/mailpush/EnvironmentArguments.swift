import ArgumentParser

/// Gives every long option an environment variable, `MAILPUSH_<OPTION>` (CONTRACT §9): a value set in the
/// environment is used when the command line does not set the option itself. librdkafka properties come
/// from `MAILPUSH_KAFKA_<PROPERTY>`, dots written as underscores, and are added as `-X` options.
enum EnvironmentArguments {
    static let prefix = "MAILPUSH_"
    static let kafkaPrefix = "MAILPUSH_KAFKA_"

    static func merge(
        arguments: [String], environment: [String: String], commands: [String: [any ParsableArguments.Type]]
    ) -> [String] {
        guard let command = arguments.first, let sources = commands[command] else { return arguments }
        var added: [String] = []
        for source in sources {
            for option in longOptions(of: source) {
                let flag = "--\(option.name)"
                guard !arguments.contains(where: { $0 == flag || $0.hasPrefix(flag + "=") }) else { continue }
                guard let value = environment[environmentName(option.name)] else { continue }
                // An empty text setting means "unset"; an empty number (a missing pod-index label, say) is an
                // error the parser reports by name, never a silent default.
                if value.isEmpty && (option.isFlag || option.isText) { continue }
                if option.isFlag {
                    if ["1", "true", "yes", "on"].contains(value.lowercased()) { added.append(flag) }
                } else {
                    added.append("\(flag)=\(value)")
                }
            }
            if source == BrokerOptions.self {
                for (name, value) in environment.sorted(by: { $0.key < $1.key }) where name.hasPrefix(kafkaPrefix) {
                    let property = name.dropFirst(kafkaPrefix.count).lowercased().replacingOccurrences(of: "_", with: ".")
                    added += ["-X", "\(property)=\(value)"]
                }
            }
        }
        // Right after the subcommand, so positional arguments and a `--` terminator keep their meaning.
        return [command] + added + arguments.dropFirst()
    }

    static func environmentName(_ option: String) -> String {
        prefix + option.uppercased().replacingOccurrences(of: "-", with: "_")
    }

    /// The long options a command declares, read from its property wrappers (ArgumentParser's default naming:
    /// `ttlSeconds` is `--ttl-seconds`). Arrays (`-X`) and option groups are left to their own mechanisms.
    private static func longOptions(of type: any ParsableArguments.Type) -> [(name: String, isFlag: Bool, isText: Bool)] {
        Mirror(reflecting: type.init()).children.compactMap { child in
            guard let label = child.label, label.hasPrefix("_") else { return nil }
            let wrapper = String(describing: Swift.type(of: child.value))
            let isFlag = wrapper.hasPrefix("Flag<")
            guard isFlag || wrapper.hasPrefix("Option<"), !wrapper.hasPrefix("Option<Array") else { return nil }
            let isText = wrapper == "Option<String>" || wrapper == "Option<Optional<String>>"
            return (kebabCase(String(label.dropFirst())), isFlag, isText)
        }
    }

    static func kebabCase(_ name: String) -> String {
        var result = ""
        for character in name {
            if character.isUppercase {
                if !result.isEmpty { result.append("-") }
                result += character.lowercased()
            } else {
                result.append(character)
            }
        }
        return result
    }
}
