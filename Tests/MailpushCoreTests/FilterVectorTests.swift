import MailpushCore
import MailpushTestSupport
import Testing

/// `Sources/MailpushTestSupport/Vectors/filters.json` (the contract's vectors): independent expectations for CONTRACT §4.
@Suite("Filter vectors")
struct FilterVectorTests {
    struct Case: Sendable, CustomTestStringConvertible {
        let name: String
        let items: [FilterItem]
        let send: Bool
        var testDescription: String { name }
    }

    static let vectors: (meta: FilterMeta, cases: [Case])? = try? load()

    static func load() throws -> (FilterMeta, [Case]) {
        let root = try SpecVectors.load("filters.json")
        let m = try #require(root["meta"])
        let meta = FilterMeta(
            type: try #require(m["type"]?.stringValue), emailAddressId: try #require(m["emailAddressId"]?.stringValue),
            sudoId: try #require(m["sudoId"]?.stringValue), folderId: try #require(m["folderId"]?.stringValue),
            keyId: m["keyId"]?.stringValue)
        let cases = try #require(root["cases"]?.arrayValue).map { c in
            // Decode the items the way the service does: through a device registration.
            let filter: JSONValue? = c["filter"]
            let send: Bool? = c["send"]?.boolValue
            let filterJSON: JSONValue = try #require(filter)
            let device = Fixtures.device().setting("filter", filterJSON)
            return Case(
                name: try #require(c["name"]?.stringValue),
                items: try DeviceRegistration.decodeFilterItems(device.bytes),
                send: try #require(send as Bool?))
        }
        return (meta, cases)
    }

    @Test func vectorsAreThere() throws {
        // Fails loudly (instead of running zero parameterized cases) if the vectors are missing.
        let (_, cases) = try Self.load()
        #expect(cases.count == 13)
    }

    @Test(arguments: vectors?.cases ?? [])
    func decidesLikeTheVector(_ c: Case) throws {
        let meta = try #require(Self.vectors?.meta)
        #expect(NotificationFilter(items: c.items).wantsNotification(for: meta) == c.send)
    }

    @Test func countsUnusableRules() throws {
        let cases = try #require(Self.vectors?.cases)
        let invalid = Dictionary(uniqueKeysWithValues: cases.map { ($0.name, NotificationFilter(items: $0.items).invalidRuleCount) })
        #expect(invalid["unparsable rule never matches"] == 1)
        #expect(invalid["unsupported operator never matches"] == 1)
        #expect(invalid["iOS initEmailNotifications"] == 0)
        #expect(invalid["only another service configured"] == 0)
    }
}
