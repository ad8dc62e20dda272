import ArgumentParser
import Foundation
import MailpushKafka

@main
struct Mailpush: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "mailpush",
        abstract: "Turns email-received events into sealed, filtered, per-device push jobs, exactly once.",
        discussion:
            "Every --flag can also be set by the environment variable MAILPUSH_<FLAG> (e.g. MAILPUSH_TTL_SECONDS); librdkafka properties by MAILPUSH_KAFKA_<PROPERTY> with dots as underscores (e.g. MAILPUSH_KAFKA_SASL_PASSWORD).",
        subcommands: [
            RunCommand.self, DevBrokerCommand.self, ReplayCommand.self, OffsetsCommand.self, TopicsCommand.self, UnsealCommand.self,
        ]
    )

    static func main() async {
        // A binary built against newer headers than the loaded library would call into behaviour that is not
        // there (librdkafka keeps its ABI, not its features), so it stops before touching Kafka.
        guard LibrdkafkaVersion.runtime(.runtime, satisfies: .headers) else {
            FileHandle.standardError.write(
                Data(
                    """
                    mailpush: librdkafka \(LibrdkafkaVersion.runtimeString) is older than \(LibrdkafkaVersion.headers), \
                    the version this binary was built with; install librdkafka \(LibrdkafkaVersion.headers) or newer

                    """.utf8))
            Foundation.exit(ExitStatus.software.rawValue)
        }
        let merged = EnvironmentArguments.merge(
            arguments: splittingJoinedKafkaProperties(Array(CommandLine.arguments.dropFirst())),
            environment: ProcessInfo.processInfo.environment)
        do {
            var command = try parseAsRoot(merged.arguments)
            if var asyncCommand = command as? any AsyncParsableCommand {
                try await asyncCommand.run()
            } else {
                try command.run()
            }
        } catch {
            // ArgumentParser ends an error it does not know (one no command turned into an exit status) with
            // status 1, which CONTRACT §9 does not have: it is an internal error, 70, said in one line.
            let message = fullMessage(for: error)
            let notes = merged.notes(for: message)
            let code = exitCode(for: error)
            if code == .validationFailure, !notes.isEmpty {
                // Right under the error's first line, above ArgumentParser's help and usage lines.
                var lines = message.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
                lines.insert(contentsOf: notes, at: 1)
                FileHandle.standardError.write(Data((lines.joined(separator: "\n") + "\n").utf8))
                Foundation.exit(ExitCode.validationFailure.rawValue)
            }
            guard code == .failure, !(error is ExitCode) else { exit(withError: error) }
            Foundation.exit(fail("stopped by an internal error: \(error)", ExitStatus.software).rawValue)
        }
    }
}

/// `-Xkey=value` as kcat (getopt) takes it, made `-X key=value`: ArgumentParser reads a joined short option
/// up to its `=` as the option's name, and would reject `-Xlinger.ms` as unknown. Arguments after `--` stay.
func splittingJoinedKafkaProperties(_ arguments: [String]) -> [String] {
    var result: [String] = []
    result.reserveCapacity(arguments.count)
    for (index, argument) in arguments.enumerated() {
        if argument == "--" {
            result += arguments[index...]
            break
        }
        if argument.hasPrefix("-X"), argument.count > 2 {
            result += ["-X", String(argument.dropFirst(2))]
        } else {
            result.append(argument)
        }
    }
    return result
}

/// Exit codes of CONTRACT §9 (sysexits.h).
enum ExitStatus {
    static let usage = ExitCode(64)
    static let unavailable = ExitCode(69)
    static let software = ExitCode(70)
    static let stateInUse = ExitCode(75)
}

/// Prints a one-line error for a person and returns the exit code to throw.
func fail(_ message: String, _ code: ExitCode) -> ExitCode {
    FileHandle.standardError.write(Data("mailpush: \(message)\n".utf8))
    return code
}
