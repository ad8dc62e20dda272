/// An email address with an optional display name (Sudo `EmailAddressAndName`).
public struct EmailAddress: Sendable, Hashable {
    public var emailAddress: String
    public var displayName: String?

    public init(emailAddress: String, displayName: String? = nil) {
        self.emailAddress = emailAddress
        self.displayName = displayName
    }
}

public enum EncryptionStatus: String, Sendable, Hashable {
    case encrypted = "ENCRYPTED"
    case unencrypted = "UNENCRYPTED"
}

/// EmailReceived v1 (CONTRACT §2): the Sudo `EmailMessageReceivedNotification` plus `owner`.
public struct EmailReceived: Sendable, Hashable {
    /// The only supported type; anything else is a dead letter.
    public static let messageReceivedType = "messageReceived"
    /// 1970 to the end of 9999. A job's expiry is computed from this time, so one outside it would wrap around or
    /// be negative, which no push service accepts. `sentAtEpochMs` is only copied, so any integer passes.
    public static let receivedAtRange: ClosedRange<Int64> = 0...253_402_300_799_999

    public var type: String
    public var owner: String
    public var emailAddressId: String
    public var sudoId: String
    public var messageId: String
    public var folderId: String
    public var encryptionStatus: EncryptionStatus
    public var subject: String?
    public var from: EmailAddress
    public var replyTo: EmailAddress?
    public var hasAttachments: Bool
    public var sentAtEpochMs: Int64
    public var receivedAtEpochMs: Int64

    public init(
        type: String = EmailReceived.messageReceivedType,
        owner: String,
        emailAddressId: String,
        sudoId: String,
        messageId: String,
        folderId: String,
        encryptionStatus: EncryptionStatus = .unencrypted,
        subject: String? = nil,
        from: EmailAddress,
        replyTo: EmailAddress? = nil,
        hasAttachments: Bool = false,
        sentAtEpochMs: Int64,
        receivedAtEpochMs: Int64
    ) {
        self.type = type
        self.owner = owner
        self.emailAddressId = emailAddressId
        self.sudoId = sudoId
        self.messageId = messageId
        self.folderId = folderId
        self.encryptionStatus = encryptionStatus
        self.subject = subject
        self.from = from
        self.replyTo = replyTo
        self.hasAttachments = hasAttachments
        self.sentAtEpochMs = sentAtEpochMs
        self.receivedAtEpochMs = receivedAtEpochMs
    }

    /// Decodes a record value of `email.received`. Unknown fields are ignored; the first
    /// problem found (in CONTRACT field order, `type` first) is reported.
    public static func decode(_ bytes: [UInt8]) throws(InputError) -> EmailReceived {
        if let event = decodeWellFormed(bytes) { return event }
        return try decodeReportingProblems(bytes)
    }

    /// The general path of `decode`: a JSON tree, then each field from it, in order, for the first problem.
    static func decodeReportingProblems(_ bytes: [UInt8]) throws(InputError) -> EmailReceived {
        let r = try FieldReader.root(bytes, what: "event")

        // Checked first: other event types have other shapes, and "unsupported type" is the
        // useful reason for them, not whichever field they happen to lack.
        let type = try r.optionalString("type") ?? messageReceivedType
        guard type == messageReceivedType else {
            throw InputError(reason: "unsupported type \(quotedForError(type))", category: InputError.Category.unsupportedType)
        }

        let owner = try r.id("owner")
        let emailAddressId = try r.id("emailAddressId")
        let sudoId = try r.id("sudoId")
        let messageId = try r.id("messageId")
        let folderId = try r.id("folderId")

        let statusText = try r.string("encryptionStatus")
        guard let encryptionStatus = EncryptionStatus(rawValue: statusText) else {
            throw .invalidField("encryptionStatus", "must be ENCRYPTED or UNENCRYPTED")
        }

        let subject = try r.optionalString("subject")
        let from = try decodeAddress(try r.object("from"))
        let replyTo = try r.optionalObject("replyTo").map { reader throws(InputError) in try decodeAddress(reader) }
        let hasAttachments = try r.bool("hasAttachments")
        let sentAtEpochMs = try r.int64("sentAtEpochMs")
        let receivedAtEpochMs = try r.int64("receivedAtEpochMs")
        guard receivedAtRange.contains(receivedAtEpochMs) else {
            throw .invalidValue(
                "receivedAtEpochMs", "must be \(receivedAtRange.lowerBound)…\(receivedAtRange.upperBound) (1970 to 9999)")
        }

        return EmailReceived(
            type: type, owner: owner, emailAddressId: emailAddressId, sudoId: sudoId,
            messageId: messageId, folderId: folderId, encryptionStatus: encryptionStatus,
            subject: subject, from: from, replyTo: replyTo, hasAttachments: hasAttachments,
            sentAtEpochMs: sentAtEpochMs, receivedAtEpochMs: receivedAtEpochMs)
    }

    private static func decodeAddress(_ r: FieldReader) throws(InputError) -> EmailAddress {
        EmailAddress(emailAddress: try r.string("emailAddress"), displayName: try r.optionalString("displayName"))
    }
}
