import MailpushCore
import Testing

/// JSON-logic semantics as in jsonlogic.com, observed through a single ENABLE item (no
/// catch-all): the device wants the notification exactly when the rule is truthy.
@Suite("JSON-logic semantics")
struct LogicSemanticsTests {
    static let meta = FilterMeta(emailAddressId: "em-7", sudoId: "sudo-3", folderId: "em-7-INBOX", keyId: "k")

    static func truthy(_ rule: String) -> Bool {
        let filter = NotificationFilter(items: [FilterItem(serviceName: "emService", action: .enable, rule: rule)])
        #expect(filter.invalidRuleCount == 0, "rule should compile: \(rule)")
        return filter.wantsNotification(for: meta)
    }

    @Test(arguments: [
        // Loose equality coerces like JavaScript.
        (#"{"==":[1,"1"]}"#, true), (#"{"==":[0,false]}"#, true), (#"{"==":["",0]}"#, true),
        (#"{"==":[null,false]}"#, false), (#"{"==":[null,null]}"#, true), (#"{"==":[true,"1"]}"#, true),
        (#"{"==":["1e3",1000]}"#, true), (#"{"==":[" 12 ",12]}"#, true), (#"{"==":["abc",0]}"#, false),
        (#"{"==":[[1],1]}"#, true), (#"{"==":[[],false]}"#, true), (#"{"==":[[1,2],"1,2"]}"#, true),
        (#"{"!=":[1,"1"]}"#, false), (#"{"!=":["a","b"]}"#, true),
        // Strict equality does not.
        (#"{"===":[1,"1"]}"#, false), (#"{"===":[1,1.0]}"#, true), (#"{"!==":[1,"1"]}"#, true),
        // Truthiness: empty array is false (JSON-logic), "0" is true (JavaScript).
        (#"{"!":[[]]}"#, true), (#"{"!!":["0"]}"#, true), (#"{"!!":[""]}"#, false), (#"{"!!":[[]]}"#, false),
        (#"{"!!":[[0]]}"#, true), (#"{"!!":0}"#, false), (#"{"!":false}"#, true),
        // and/or return operand values.
        (#"{"and":[true,"a",3]}"#, true), (#"{"and":[true,0,3]}"#, false), (#"{"or":[false,0,""]}"#, false),
        (#"{"or":[false,"x"]}"#, true), (#"{"and":[]}"#, false), (#"{"or":[]}"#, false),
        // in: substring on strings, strict membership on arrays.
        (#"{"in":["Spring","Springfield"]}"#, true), (#"{"in":["x",["a","x"]]}"#, true),
        (#"{"in":[1,["1"]]}"#, false), (#"{"in":["a",5]}"#, false), (#"{"in":["-INBOX",{"var":"meta.folderId"}]}"#, true),
        (#"{"in":["e\u0301",["é"]]}"#, false),
        // var: dotted paths, defaults, whole data, evaluated operands.
        (#"{"var":"meta.type"}"#, true), (#"{"var":""}"#, true), (#"{"var":["meta.nothing",0]}"#, false),
        (#"{"var":["meta.nothing","fallback"]}"#, true), (#"{"var":"meta.sudoId.deeper"}"#, false),
        (#"{"==":[{"var":"meta"},{"var":"meta"}]}"#, false),
        (#"{"==":[{"var":{"var":"meta.keyId"}},null]}"#, true),
        (#"{"==":[{"var":["meta.keyId"]},"k"]}"#, true),
        (#"{"in":[{"var":"meta.sudoId"},[{"var":"meta.sudoId"},"other"]]}"#, true),
        // Literals are rules too.
        ("true", true), ("false", false), ("0", false), (#""x""#, true), ("[]", false), ("[0]", true), ("null", false),
    ])
    func evaluatesLikeJSONLogic(_ rule: String, _ expected: Bool) {
        #expect(Self.truthy(rule) == expected, "\(rule)")
    }

    @Test func keyIdAbsentIsNotFound() {
        let filter = NotificationFilter(items: [
            FilterItem(serviceName: "emService", action: .enable, rule: #"{"==":[{"var":["meta.keyId","none"]},"none"]}"#)
        ])
        #expect(filter.wantsNotification(for: FilterMeta(emailAddressId: "a", sudoId: "s", folderId: "f", keyId: nil)))
        #expect(!filter.wantsNotification(for: FilterMeta(emailAddressId: "a", sudoId: "s", folderId: "f", keyId: "k")))
    }
}
