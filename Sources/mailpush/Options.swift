import ArgumentParser
import Foundation
import Logging
import MailpushCore
import MailpushKafka
import MailpushMultiBufferRSA
import MailpushPipeline
import MailpushState

struct BrokerOptions: ParsableArguments {
    @Option(help: "Kafka bootstrap servers, host:port,… (env MAILPUSH_BROKERS). `run` without it starts an embedded development broker.")
    var brokers: String?

    @Option(
        name: .customShort("X"), help: ArgumentHelp("A librdkafka property, key=value, as kcat -X (repeatable).", valueName: "key=value"))
    var kafkaProperties: [String] = []

    @Option(help: "How long to wait for the broker at start-up before exiting with code 69.")
    var startupTimeoutSeconds: Int = 30

    func validate() throws {
        _ = try properties()
        guard (1...86_400).contains(startupTimeoutSeconds) else {
            throw ValidationError("--startup-timeout-seconds must be 1…86400, got \(startupTimeoutSeconds)")
        }
        if let brokers {
            for server in brokers.split(separator: ",", omittingEmptySubsequences: false) {
                let parts = server.split(separator: ":")
                guard parts.count >= 2, !parts[0].isEmpty, let port = Int(parts.last!), (1...65535).contains(port) else {
                    throw ValidationError("--brokers: \"\(server)\" is not host:port")
                }
            }
        }
    }

    func properties() throws -> [String: String] {
        var result: [String: String] = [:]
        for property in kafkaProperties {
            guard let equals = property.firstIndex(of: "="), equals != property.startIndex else {
                // Without `=` there is no telling the key from a secret: the argument is not repeated.
                throw ValidationError("-X: expected key=value, got an argument without \"=\" (not shown: it may hold a secret)")
            }
            let key = String(property[..<equals])
            let value = String(property[property.index(after: equals)...])
            if let why = PipelineConfiguration.whyPropertyIsFixed(key, value) {
                throw ValidationError("-X \(key) (or \(EnvironmentArguments.kafkaPrefix)…) cannot be set: \(why)")
            }
            result[key] = value
        }
        return result
    }

    func kafkaConfiguration(bootstrap: String, logger: Logger) throws -> KafkaConfiguration {
        var configuration = KafkaConfiguration(bootstrapServers: bootstrap, properties: try properties())
        configuration.logHandler = { level, facility, message in
            logger.log(
                level: level.rawValue <= 3 ? .error : level.rawValue == 4 ? .warning : .debug, "librdkafka: \(message)",
                metadata: ["facility": "\(facility)"])
        }
        return configuration
    }
}

struct StateOptions: ParsableArguments {
    @Option(help: "Directory of the SQLite state (offsets, config, dedupe window).")
    var stateDir: String = "./.mailpush"

    /// Whether the state directory holds a state, or is anything but a directory (which `open` then names).
    var exists: Bool {
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: stateDir, isDirectory: &isDirectory) else { return false }
        return !isDirectory.boolValue
            || FileManager.default.fileExists(atPath: (stateDir as NSString).appendingPathComponent(StateStore.fileName))
    }

    /// - Parameter checkpointsInBackground: see `StateStore.init`; the service's pipeline runs them.
    func open(checkpointsInBackground: Bool = false) throws -> StateStore {
        do {
            return try StateStore(directory: stateDir, checkpointsInBackground: checkpointsInBackground)
        } catch {
            throw fail("--state-dir: \(error)", ExitStatus.software)
        }
    }

    /// Takes the state directory's writer lock, or exits with status 75 naming the directory when another
    /// process holds it. The lock lasts as long as the returned object.
    func lock(_ hint: String) throws -> StateDirectoryLock {
        let attempt: StateDirectoryLock.Attempt
        do {
            attempt = try StateDirectoryLock.tryAcquire(directory: stateDir)
        } catch {
            throw fail("--state-dir: \(error)", ExitStatus.software)
        }
        switch attempt {
        case .acquired(let lock):
            return lock
        case .held(let pid):
            throw fail(inUseMessage(pid) + "; " + hint, ExitStatus.stateInUse)
        }
    }

    func inUseMessage(_ pid: Int32?) -> String {
        let holder = pid.map { " (pid \($0))" } ?? ""
        return "state directory \(stateDir) is in use by another mailpush process\(holder): "
            + "\((stateDir as NSString).appendingPathComponent(StateDirectoryLock.fileName)) is locked"
    }
}

struct TopicOptions: ParsableArguments {
    @Option(help: "Topic of EmailReceived events.") var eventsTopic = Topics().events
    @Option(help: "Compacted topic of device registrations.") var devicesTopic = Topics().devices
    @Option(help: "Compacted topic of address keys.") var keysTopic = Topics().addressKeys
    @Option(help: "Topic push jobs are written to.") var jobsTopic = Topics().jobs
    @Option(help: "Topic dead letters are written to.") var deadLetterTopic = Topics().deadLetters

    var topics: Topics {
        var topics = Topics()
        topics.events = eventsTopic
        topics.devices = devicesTopic
        topics.addressKeys = keysTopic
        topics.jobs = jobsTopic
        topics.deadLetters = deadLetterTopic
        return topics
    }

    func validate() throws {
        let named = [
            ("--events-topic", eventsTopic), ("--devices-topic", devicesTopic), ("--keys-topic", keysTopic),
            ("--jobs-topic", jobsTopic), ("--dead-letter-topic", deadLetterTopic),
        ]
        for (flag, name) in named { try Self.validateName(name, flag: flag) }
        guard Set(named.map(\.1)).count == named.count else {
            throw ValidationError("topic names must all differ: \(named.map { "\($0.0) \($0.1)" }.joined(separator: ", "))")
        }
    }

    static func validateName(_ name: String, flag: String) throws {
        guard isKafkaName(name) else { throw ValidationError("\(flag): \"\(name)\" is not a valid Kafka topic name") }
    }

    /// 1…249 of letters, digits, '.', '_' and '-': what Kafka accepts for a topic name or a group instance id.
    static func isKafkaName(_ name: String) -> Bool {
        !name.isEmpty && name.count <= 249 && name.allSatisfy { $0.isASCII && ($0.isLetter || $0.isNumber || "._-".contains($0)) }
    }
}

struct RenderFlags: ParsableArguments {
    @Option(help: "Endpoint for sponsor (com method 3) devices' webhook jobs.") var sponsorWebhookUrl: String?
    @Option(help: "iOS alert title placeholder (the Notification Service Extension replaces it).") var alertTitle = RenderOptions()
        .alertTitle
    @Option(help: "iOS alert body placeholder.") var alertBody = RenderOptions().alertBody
    @Option(help: "Push job time to live after the email was received, in seconds.") var ttlSeconds: Int64 = 2_419_200
    @Option(help: "Window in which a re-read email is not processed again, in seconds.") var dedupeWindowSeconds: Int64 = 604_800
    @Option(
        help:
            "auto: RSA operations eight at a time when Intel's libcrypto_mb is installed and the processor has AVX-512 IFMA; off: one at a time."
    ) var rsaMultiBuffer: String = "auto"

    func validate() throws {
        let ttl = RenderOptions.ttlSecondsRange
        guard ttl.contains(ttlSeconds) else {
            throw ValidationError("--ttl-seconds must be \(ttl.lowerBound)…\(ttl.upperBound) (100 years), got \(ttlSeconds)")
        }
        let window = PipelineConfiguration.dedupeWindowSecondsRange
        guard window.contains(dedupeWindowSeconds) else {
            throw ValidationError(
                "--dedupe-window-seconds must be \(window.lowerBound)…\(window.upperBound) (100 years), got \(dedupeWindowSeconds)")
        }
        guard !alertTitle.isEmpty || !alertBody.isEmpty else {
            throw ValidationError(
                "--alert-title and --alert-body cannot both be empty: iOS ignores an extension's changes without alert text")
        }
        let alertBytes = alertTitle.utf8.count + alertBody.utf8.count
        guard alertBytes <= RenderOptions.maxAlertBytes else {
            throw ValidationError(
                "--alert-title and --alert-body must be at most \(RenderOptions.maxAlertBytes) UTF-8 bytes together, got "
                    + "\(alertBytes): they go into every iOS job's APNs payload, whose 4096 bytes must keep room for the sealed data")
        }
        guard ["auto", "off"].contains(rsaMultiBuffer) else {
            throw ValidationError("--rsa-multi-buffer must be auto or off, got \(quotedForError(rsaMultiBuffer))")
        }
        if let url = sponsorWebhookUrl {
            // Foundation takes a URL with a line break or a space in it; a sender would not.
            guard let parsed = URL(string: url), ["http", "https"].contains(parsed.scheme?.lowercased() ?? ""), parsed.host != nil,
                url.unicodeScalars.allSatisfy({ $0.value > 0x20 && $0.value < 0x7F }), url.utf8.count <= 4096
            else {
                throw ValidationError(
                    "--sponsor-webhook-url: \(quotedForError(url)) is not an http(s) URL (printable ASCII, at most 4096 bytes)")
            }
        }
    }

    var renderOptions: RenderOptions {
        var options = RenderOptions(
            alertTitle: alertTitle, alertBody: alertBody, ttlSeconds: ttlSeconds, sponsorWebhookURL: sponsorWebhookUrl)
        if rsaMultiBuffer == "auto", case .success(let multiBuffer) = Self.multiBufferRSA { options.multiBufferRSA = multiBuffer }
        return options
    }

    /// How the RSA operations are done, for the start-up line.
    var rsaDescription: String {
        guard rsaMultiBuffer == "auto" else { return "one at a time (swift-crypto; --rsa-multi-buffer off)" }
        switch Self.multiBufferRSA {
        case .success(let multiBuffer): return multiBuffer.description
        case .failure(let why): return "one at a time (swift-crypto): \(why)"
        }
    }

    /// Loaded once, when first asked.
    static let multiBufferRSA = MultiBufferRSA.load()
}

struct LogOptions: ParsableArguments {
    @Option(help: "trace, debug, info, notice, warning, error or critical.") var logLevel: String = "info"
    @Option(help: "json (one object a line) or text.") var logFormat: String = "json"

    func validate() throws {
        guard Logger.Level(rawValue: logLevel) != nil else {
            throw ValidationError(
                "--log-level: \"\(logLevel)\" is not one of \(Logger.Level.allCases.map(\.rawValue).joined(separator: ", "))")
        }
        guard ["json", "text"].contains(logFormat) else { throw ValidationError("--log-format: \"\(logFormat)\" is not json or text") }
    }

    func bootstrap() {
        let level = Logger.Level(rawValue: logLevel) ?? .info
        let format: LineLogHandler.Format = logFormat == "json" ? .json : .text
        LoggingSystem.bootstrap { label in
            var handler = LineLogHandler(label: label, format: format)
            handler.logLevel = level
            return handler
        }
    }
}
