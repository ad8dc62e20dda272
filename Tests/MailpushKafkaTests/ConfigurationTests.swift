import MailpushKafka
import Testing

@Suite struct ConfigurationTests {
    // The value may be a secret (a misspelled `sasl.password` is still a password): the key is named, the
    // value never shown.
    @Test(arguments: [("no.such.property", "hunter2-secret"), ("linger.ms", "soon-secret"), ("acks", "some-secret")])
    func invalidPassthroughPropertyNamesKeyNotValue(key: String, value: String) throws {
        let configuration = KafkaConfiguration(bootstrapServers: "127.0.0.1:1", properties: [key: value])
        for make in [
            { _ = try KafkaProducer(configuration: configuration) },
            { _ = try KafkaConsumer(configuration: configuration) },
            { _ = try KafkaCluster(configuration: configuration) },
        ] as [() throws -> Void] {
            do {
                try make()
                Issue.record("\(key)=\(value) was accepted")
            } catch let error as KafkaError {
                #expect(error.description.contains("property \(key) (value not shown)"), "\(error)")
                #expect(!error.description.contains(value), "\(error)")
                #expect(error.name == "_INVALID_ARG")
            }
        }
    }

    @Test func passthroughOverridesDefaults() throws {
        // Idempotence needs acks=all: overriding acks alone must reach librdkafka, which then refuses the combination.
        #expect(throws: KafkaError.self) {
            _ = try KafkaProducer(configuration: KafkaConfiguration(bootstrapServers: "127.0.0.1:1", properties: ["acks": "1"]))
        }
        _ = try KafkaProducer(
            configuration: KafkaConfiguration(
                bootstrapServers: "127.0.0.1:1", properties: ["acks": "1", "enable.idempotence": "false"]))
    }

    @Test func errorDescriptionIsReadable() async throws {
        let mock = try makeMock()
        let address = mock.bootstrapServers
        mock.close()
        let errors = Collected<KafkaError>()
        var configuration = KafkaConfiguration(bootstrapServers: address)
        configuration.errorHandler = { errors.append($0) }
        let producer = try KafkaProducer(configuration: configuration)
        _ = producer
        let deadline = ContinuousClock.now + .seconds(5)
        while errors.all.isEmpty, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(50)) }
        let transport = try #require(errors.all.first { $0.name == "_TRANSPORT" || $0.name == "_ALL_BROKERS_DOWN" })
        #expect(transport.isRetriable)
        #expect(transport.description.hasSuffix("(\(transport.name))"))
        #expect(
            KafkaError(code: -195, name: "_TRANSPORT", message: "Local: Broker transport failure").description
                == "Local: Broker transport failure (_TRANSPORT)")
    }

    @Test func logHandlerReceivesLibrdkafkaLines() async throws {
        let mock = try makeMock()
        let lines = Collected<String>()
        var configuration = config(mock, ["debug": "metadata"])
        configuration.logHandler = { level, facility, message in lines.append("\(level) \(facility) \(message)") }
        let cluster = try KafkaCluster(configuration: configuration)
        try await cluster.waitUntilReachable(timeout: .seconds(5))
        #expect(lines.all.contains { $0.hasPrefix("debug") })
    }
}
