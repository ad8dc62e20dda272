/// The UTF-8 JSON that gets sealed (CONTRACT §6): exactly these keys, in this order —
/// `type, owner, emailAddressId, sudoId, messageId, folderId, encryptionStatus, subject, from,
/// replyTo (only if present), hasAttachments, sentAtEpochMs, receivedAtEpochMs`.
/// `subject` is always present (`null` if none); `displayName`s are left out when absent.
public func notificationPlaintext(_ event: EmailReceived) -> [UInt8] {
    NotificationText(event).plaintext(event)
}

/// The free-text fields that may be shortened to fit the push size limit, in the order they
/// are shortened (PayloadBudget.swift).
struct NotificationText: Equatable {
    var subject: String?
    var fromName: String?
    var replyToName: String?

    init(_ event: EmailReceived) {
        subject = event.subject
        fromName = event.from.displayName
        replyToName = event.replyTo?.displayName
    }

    func plaintext(_ event: EmailReceived) -> [UInt8] {
        var w = JSONWriter(capacity: 256 + (subject?.utf8.count ?? 0))
        w.beginObject()
        w.field("type", event.type)
        w.field("owner", event.owner)
        w.field("emailAddressId", event.emailAddressId)
        w.field("sudoId", event.sudoId)
        w.field("messageId", event.messageId)
        w.field("folderId", event.folderId)
        w.field("encryptionStatus", event.encryptionStatus.rawValue)
        w.field("subject", subject)
        w.key("from")
        Self.writeAddress(event.from.emailAddress, fromName, to: &w)
        if let replyTo = event.replyTo {
            w.key("replyTo")
            Self.writeAddress(replyTo.emailAddress, replyToName, to: &w)
        }
        w.field("hasAttachments", event.hasAttachments)
        w.field("sentAtEpochMs", event.sentAtEpochMs)
        w.field("receivedAtEpochMs", event.receivedAtEpochMs)
        w.endObject()
        return w.bytes
    }

    private static func writeAddress(_ address: String, _ name: String?, to w: inout JSONWriter) {
        w.beginObject()
        w.field("emailAddress", address)
        if let name { w.field("displayName", name) }
        w.endObject()
    }
}
