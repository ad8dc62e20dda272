/// `EmailReceived.decode`'s common case: a well-formed event read member by member, straight into its fields,
/// without building a JSON tree (a dictionary, and a string per key) to look them up in. It accepts exactly
/// the events the general path accepts, and gives the same values; anything else (invalid JSON, a missing or
/// mistyped field, a key with an escape) makes it give up, and the general path, which names the problem, runs.
extension EmailReceived {
    static func decodeWellFormed(_ bytes: [UInt8]) -> EmailReceived? {
        bytes.withUnsafeBufferPointer { buffer in
            var parser = JSONParser(buffer)
            var fields = EventFields()
            parser.skipWhitespace()
            guard parser.peek() == UInt8(ascii: "{") else { return nil }
            do {
                try parser.forEachMember { parser, key throws(JSONParseError) in try fields.read(key, from: &parser) }
            } catch {
                return nil
            }
            guard parser.isAtEndOfDocument() else { return nil }
            return fields.event()
        }
    }
}

/// A member as read: absent (or `null`, which counts as absent), a value of the expected type, or another type.
private enum Member<Value> {
    case absent
    case value(Value)
    case mistyped

    /// The value, absent as nil; nil for `.mistyped` too, through `valid`.
    var valid: Value?? {
        switch self {
        case .absent: return .some(nil)
        case .value(let value): return .some(value)
        case .mistyped: return nil
        }
    }
}

private struct AddressFields {
    var emailAddress = Member<String>.absent
    var displayName = Member<String>.absent

    mutating func read(_ key: UnsafeBufferPointer<UInt8>, from parser: inout JSONParser) throws(JSONParseError) {
        if key.elementsEqual("emailAddress".utf8) {
            emailAddress = try parser.readString()
        } else if key.elementsEqual("displayName".utf8) {
            displayName = try parser.readString()
        } else {
            _ = try parser.parseValue()
        }
    }

    var address: EmailAddress? {
        guard case .value(let emailAddress) = emailAddress, let displayName = displayName.valid else { return nil }
        return EmailAddress(emailAddress: emailAddress, displayName: displayName)
    }
}

private struct EventFields {
    var type = Member<String>.absent
    var owner = Member<String>.absent
    var emailAddressId = Member<String>.absent
    var sudoId = Member<String>.absent
    var messageId = Member<String>.absent
    var folderId = Member<String>.absent
    var encryptionStatus = Member<String>.absent
    var subject = Member<String>.absent
    var from = Member<AddressFields>.absent
    var replyTo = Member<AddressFields>.absent
    var hasAttachments = Member<Bool>.absent
    var sentAtEpochMs = Member<Int64>.absent
    var receivedAtEpochMs = Member<Int64>.absent

    /// A member of the event; a repeated key replaces the earlier value, as in the general path.
    mutating func read(_ key: UnsafeBufferPointer<UInt8>, from parser: inout JSONParser) throws(JSONParseError) {
        switch key.count {
        case 4 where key.elementsEqual("type".utf8): type = try parser.readString()
        case 4 where key.elementsEqual("from".utf8): from = try parser.readAddress()
        case 5 where key.elementsEqual("owner".utf8): owner = try parser.readString()
        case 6 where key.elementsEqual("sudoId".utf8): sudoId = try parser.readString()
        case 7 where key.elementsEqual("subject".utf8): subject = try parser.readString()
        case 7 where key.elementsEqual("replyTo".utf8): replyTo = try parser.readAddress()
        case 8 where key.elementsEqual("folderId".utf8): folderId = try parser.readString()
        case 9 where key.elementsEqual("messageId".utf8): messageId = try parser.readString()
        case 13 where key.elementsEqual("sentAtEpochMs".utf8): sentAtEpochMs = try parser.readInt64()
        case 14 where key.elementsEqual("emailAddressId".utf8): emailAddressId = try parser.readString()
        case 14 where key.elementsEqual("hasAttachments".utf8): hasAttachments = try parser.readBool()
        case 16 where key.elementsEqual("encryptionStatus".utf8): encryptionStatus = try parser.readString()
        case 17 where key.elementsEqual("receivedAtEpochMs".utf8): receivedAtEpochMs = try parser.readInt64()
        default: _ = try parser.parseValue()
        }
    }

    /// The event, if every field is as `EmailReceived.decode` requires.
    func event() -> EmailReceived? {
        guard let type = type.valid, (type ?? EmailReceived.messageReceivedType) == EmailReceived.messageReceivedType,
            let owner = Self.id(owner), let emailAddressId = Self.id(emailAddressId), let sudoId = Self.id(sudoId),
            let messageId = Self.id(messageId), let folderId = Self.id(folderId),
            case .value(let statusText) = encryptionStatus, let encryptionStatus = EncryptionStatus(rawValue: statusText),
            let subject = subject.valid,
            case .value(let fromFields) = from, let from = fromFields.address,
            let replyToFields = replyTo.valid,
            case .value(let hasAttachments) = hasAttachments,
            case .value(let sentAtEpochMs) = sentAtEpochMs, case .value(let receivedAtEpochMs) = receivedAtEpochMs,
            EmailReceived.receivedAtRange.contains(receivedAtEpochMs)
        else { return nil }
        var replyTo: EmailAddress?
        if let replyToFields {
            guard let address = replyToFields.address else { return nil }
            replyTo = address
        }
        return EmailReceived(
            type: EmailReceived.messageReceivedType, owner: owner, emailAddressId: emailAddressId, sudoId: sudoId,
            messageId: messageId, folderId: folderId, encryptionStatus: encryptionStatus, subject: subject, from: from,
            replyTo: replyTo, hasAttachments: hasAttachments, sentAtEpochMs: sentAtEpochMs,
            receivedAtEpochMs: receivedAtEpochMs)
    }

    /// An id as `FieldReader.id` accepts it.
    private static func id(_ member: Member<String>) -> String? {
        guard case .value(let id) = member, !id.isEmpty, id.utf8.count <= InputLimits.maxIdBytes, !id.utf8.contains(0) else {
            return nil
        }
        return id
    }
}

extension JSONParser {
    /// A member's value: read by `read` when its first byte is one `isExpected` accepts, absent for `null`,
    /// mistyped (and skipped) otherwise.
    private mutating func readMember<Value>(
        startingWith isExpected: (UInt8) -> Bool, _ read: (inout JSONParser) throws(JSONParseError) -> Value
    ) throws(JSONParseError) -> Member<Value> {
        switch peek() {
        case let first? where isExpected(first): return .value(try read(&self))
        case UInt8(ascii: "n"):
            try expectLiteral("null")
            return .absent
        default:
            _ = try parseValue()
            return .mistyped
        }
    }

    fileprivate mutating func readString() throws(JSONParseError) -> Member<String> {
        try readMember(startingWith: { $0 == UInt8(ascii: "\"") }) { parser throws(JSONParseError) in try parser.parseString() }
    }

    fileprivate mutating func readBool() throws(JSONParseError) -> Member<Bool> {
        try readMember(startingWith: { $0 == UInt8(ascii: "t") || $0 == UInt8(ascii: "f") }) { parser throws(JSONParseError) in
            try parser.parseValue() == .bool(true)
        }
    }

    /// Integral numbers however written, as `FieldReader.int64`.
    fileprivate mutating func readInt64() throws(JSONParseError) -> Member<Int64> {
        let number = try readMember(startingWith: { $0 == UInt8(ascii: "-") || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains($0) }) {
            parser throws(JSONParseError) in try parser.parseNumber()
        }
        switch number {
        case .value(let number): return number.int64Value.map { .value($0) } ?? .mistyped
        case .absent: return .absent
        case .mistyped: return .mistyped
        }
    }

    fileprivate mutating func readAddress() throws(JSONParseError) -> Member<AddressFields> {
        try readMember(startingWith: { $0 == UInt8(ascii: "{") }) { parser throws(JSONParseError) in
            var fields = AddressFields()
            try parser.forEachMember { parser, key throws(JSONParseError) in try fields.read(key, from: &parser) }
            return fields
        }
    }
}
