import MailpushCore

/// A JSON object fixture whose members can be removed or replaced, to produce the exact bytes
/// a producer would write — valid ones and each kind of broken one. Members keep their order.
public struct JSONObjectFixture: Sendable {
    public var members: [(String, JSONValue)]

    public init(_ members: [(String, JSONValue)]) {
        self.members = members
    }

    /// Sets a member; a dotted path reaches into nested objects (`from.displayName`).
    /// `nil` removes it.
    public func setting(_ path: String, _ value: JSONValue?) -> JSONObjectFixture {
        var copy = self
        copy.set(path.split(separator: ".").map(String.init)[...], value)
        return copy
    }

    public func removing(_ path: String) -> JSONObjectFixture { setting(path, nil) }

    public var bytes: [UInt8] {
        var w = JSONWriter()
        w.beginObject()
        for (k, v) in members {
            w.key(k)
            w.value(v)
        }
        w.endObject()
        return w.bytes
    }

    public var string: String { String(decoding: bytes, as: UTF8.self) }

    private mutating func set(_ path: ArraySlice<String>, _ value: JSONValue?) {
        guard let head = path.first else { return }
        let index = members.firstIndex { $0.0 == head }
        if path.count == 1 {
            switch (index, value) {
            case (let i?, let v?): members[i].1 = v
            case (nil, let v?): members.append((head, v))
            case (let i?, nil): members.remove(at: i)
            case (nil, nil): break
            }
            return
        }
        guard let i = index, case .object(let nested) = members[i].1 else { return }
        var inner = JSONObjectFixture(nested.sorted { $0.key < $1.key }.map { ($0.key, $0.value) })
        inner.set(path.dropFirst(), value)
        members[i].1 = .object(Dictionary(uniqueKeysWithValues: inner.members))
    }
}

/// Builders for the three input record kinds, defaulting to the CONTRACT examples.
public enum Fixtures {
    /// EmailReceived v1 as in CONTRACT §2.
    public static func event(
        owner: String = "user-1", emailAddressId: String = "em-add-1", sudoId: String = "sudo-1",
        messageId: String = "em-msg-1", folderId: String? = nil, subject: String? = "Hello",
        fromAddress: String = "a@example.com", fromName: String? = "Alice",
        replyTo: String? = "r@example.com", replyToName: String? = nil,
        sentAtEpochMs: Int64 = 1_718_330_537_000, receivedAtEpochMs: Int64 = 1_718_330_541_336
    ) -> JSONObjectFixture {
        var from: [String: JSONValue] = ["emailAddress": .string(fromAddress)]
        if let fromName { from["displayName"] = .string(fromName) }
        var members: [(String, JSONValue)] = [
            ("type", .string("messageReceived")), ("owner", .string(owner)),
            ("emailAddressId", .string(emailAddressId)), ("sudoId", .string(sudoId)),
            ("messageId", .string(messageId)), ("folderId", .string(folderId ?? "\(emailAddressId)-INBOX")),
            ("encryptionStatus", .string("UNENCRYPTED")),
            ("subject", subject.map(JSONValue.string) ?? .null), ("from", .object(from)),
        ]
        if let replyTo {
            var r: [String: JSONValue] = ["emailAddress": .string(replyTo)]
            if let replyToName { r["displayName"] = .string(replyToName) }
            members.append(("replyTo", .object(r)))
        }
        members += [
            ("hasAttachments", .bool(false)), ("sentAtEpochMs", .number(JSONNumber(sentAtEpochMs))),
            ("receivedAtEpochMs", .number(JSONNumber(receivedAtEpochMs))),
        ]
        return JSONObjectFixture(members)
    }

    /// How a device registered (CONTRACT §3).
    public enum DeviceTarget: Sendable {
        case ios(token: String)
        case android(token: String)
        /// `comMethod` type 4, value `FCM:<token>`.
        case comMethodFCM(token: String)
        /// `comMethod` type 3, value = sponsee details.
        case comMethodWebhook(sponseeDetails: String)
    }

    /// DeviceRegistration v1; `filter` defaults to a fresh iOS `initEmailNotifications()`.
    public static func device(
        deviceId: String = "dev-1", owner: String = "user-1", bundleId: String? = "com.example.mail",
        target: DeviceTarget = .ios(token: "apns-token-1"),
        filter: SudoFilterList = SudoFilterList().initEmailNotifications(on: .ios)
    ) -> JSONObjectFixture {
        var members: [(String, JSONValue)] = [("deviceId", .string(deviceId)), ("owner", .string(owner))]
        if let bundleId { members.append(("bundleId", .string(bundleId))) }
        switch target {
        case .ios(let token):
            members += [("platform", .string("ios")), ("pushToken", .string(token))]
        case .android(let token):
            members += [("platform", .string("android")), ("pushToken", .string(token))]
        case .comMethodFCM(let token):
            members.append(("comMethod", comMethod(type: 4, value: "FCM:\(token)")))
        case .comMethodWebhook(let details):
            members.append(("comMethod", comMethod(type: 3, value: details)))
        }
        members.append(("filter", filterJSON(filter.items)))
        return JSONObjectFixture(members)
    }

    public static func comMethod(type: Int64, value: String, id: String = "sponsee-1") -> JSONValue {
        .object(["id": .string(id), "type": .number(JSONNumber(type)), "value": .string(value)])
    }

    /// The `filter` array as clients send it.
    public static func filterJSON(_ items: [FilterItem]) -> JSONValue {
        .array(
            items.map { item in
                var o: [String: JSONValue] = [
                    "serviceName": .string(item.serviceName), "actionType": .string(item.action.rawValue),
                    "rule": .string(item.rule),
                ]
                if let meta = item.enableMeta { o["enableMeta"] = .string(meta) }
                return .object(o)
            })
    }

    /// AddressKey v1 (CONTRACT §5).
    public static func addressKey(
        emailAddressId: String = "em-add-1", owner: String = "user-1", keyId: String = "key-1",
        algorithm: String = SealingAlgorithm.rsaOAEPAESCBC.rawValue, keyFormat: String = "SPKI", publicKey: String
    ) -> JSONObjectFixture {
        JSONObjectFixture([
            ("emailAddressId", .string(emailAddressId)), ("owner", .string(owner)), ("keyId", .string(keyId)),
            ("algorithm", .string(algorithm)), ("keyFormat", .string(keyFormat)), ("publicKey", .string(publicKey)),
        ])
    }
}
