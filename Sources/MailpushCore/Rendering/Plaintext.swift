/// The UTF-8 JSON that gets sealed (CONTRACT §6): exactly these keys, in this order —
/// `type, owner, emailAddressId, sudoId, messageId, folderId, encryptionStatus, subject, from,
/// replyTo (only if present), hasAttachments, sentAtEpochMs, receivedAtEpochMs`.
/// `subject` is always present (`null` if none); `displayName`s are left out when absent.
public func notificationPlaintext(_ event: EmailReceived) -> [UInt8] {
    NotificationText(event).plaintext(event)
}

/// The free-text fields that may be shortened to fit the push size limit, in the order they
/// are shortened.
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

    /// Shortens the fields, in order, until the plaintext is at most `limit` bytes. Each cut
    /// keeps the longest prefix of whole Characters (grapheme clusters, so no emoji or
    /// combining sequence is split) that fits, and appends "…". Returns `nil` when even
    /// shortening all three is not enough.
    mutating func shorten(currentLength: Int, toFit limit: Int) -> Int? {
        var length = currentLength
        for keyPath in [\NotificationText.subject, \.fromName, \.replyToName] where length > limit {
            guard let text = self[keyPath: keyPath] else { continue }
            let available = JSONWriter.escapedLength(of: text) - (length - limit)
            guard let cut = Self.longestPrefix(of: text, fittingEscapedLength: available - Self.ellipsisLength) else {
                // Not even "…" fits in the room this field could give. Cut it to "…" anyway
                // when that saves bytes, and let the next field make up the rest.
                let saved = JSONWriter.escapedLength(of: text) - Self.ellipsisLength
                if saved > 0 {
                    self[keyPath: keyPath] = Self.ellipsis
                    length -= saved
                }
                continue
            }
            let shortened = cut + Self.ellipsis
            length += JSONWriter.escapedLength(of: shortened) - JSONWriter.escapedLength(of: text)
            self[keyPath: keyPath] = shortened
        }
        return length <= limit ? length : nil
    }

    static let ellipsis = "…"
    static let ellipsisLength = ellipsis.utf8.count  // 3, never escaped

    /// The longest prefix of whole Characters whose escaped UTF-8 length is ≤ `budget`
    /// (binary search over the cumulative lengths), or `nil` if `budget` < 0.
    static func longestPrefix(of text: String, fittingEscapedLength budget: Int) -> String? {
        guard budget >= 0 else { return nil }
        var ends: [String.Index] = []
        var cumulative: [Int] = []
        var total = 0
        var index = text.startIndex
        while index < text.endIndex {
            let next = text.index(after: index)
            total += JSONWriter.escapedLength(utf8: text.utf8[index..<next])
            ends.append(next)
            cumulative.append(total)
            index = next
        }
        // Number of leading Characters that fit: first k with cumulative[k] > budget.
        var low = 0
        var high = cumulative.count
        while low < high {
            let mid = (low + high) / 2
            if cumulative[mid] <= budget { low = mid + 1 } else { high = mid }
        }
        return low == 0 ? "" : String(text[..<ends[low - 1]])
    }
}
