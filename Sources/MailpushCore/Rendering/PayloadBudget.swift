/// The 4096-byte push limit (CONTRACT §7): how long the plaintext may be so that its sealed
/// base64, framed as `apns.payload` or `fcm.message.data`, fits, and the shortening of subject,
/// then from.displayName, then replyTo.displayName when it does not.
extension JobRenderer {
    enum Frame {
        /// `apns.payload`: `{"aps":{…},"sudoplatform":{…},"jobId":…}`.
        case apns
        /// `fcm.message.data`: `{"sudoplatform":"<JSON text>","jobId":…}`.
        case fcm
    }

    /// Writes the serialized `apns.payload` / `fcm.message.data`, within `maxPushPayloadBytes`, as the writer's
    /// next value: straight into the job's buffer, the base64 of the sealed bytes included.
    func writeSealedPayload(
        sealing: PreparedEmail.Sealing, encryptedKey: EncryptedAESKey?, jobId: String, frame: Frame, to w: inout JSONWriter
    ) throws(RenderError) {
        let key = sealing.key
        let prefix = frame == .apns ? sealing.apnsPrefix : sealing.fcmPrefix
        guard let plaintext = frame == .apns ? sealing.apnsPlaintext : sealing.fcmPlaintext else { throw .payloadTooLarge }

        try w.rawValue { (payload: inout [UInt8]) throws(RenderError) in
            let start = payload.count
            payload.append(contentsOf: prefix)
            do {
                try Sealer.sealBase64(plaintext, with: key, encryptedKey: encryptedKey, into: &payload)
            } catch {
                throw .sealingFailed("\(error)")
            }
            Self.appendPayloadSuffix(jobId: jobId, frame: frame, to: &payload)
            // Cannot happen while the size arithmetic matches the serialization (the tests check
            // it does); if it ever stopped matching, dead-letter rather than send an oversized push.
            guard payload.count - start <= Self.maxPushPayloadBytes else {
                assertionFailure("size computation out of step with serialization")
                throw .payloadTooLarge
            }
        }
    }

    /// The plaintext to seal in `frame`: the email's own (`plaintext`), or, when its sealed payload would exceed
    /// `maxPushPayloadBytes`, a copy with subject and display names shortened (CONTRACT §7); nil when even that
    /// does not fit. The room depends only on the key (through `prefix`), the frame and the job id's fixed length,
    /// so an email's jobs share the result (`PreparedEmail`): shortening walks the subject, which may be as long as
    /// an event (a 900 KB subject cost 0.1 s a job when each job shortened it again).
    static func fittedPlaintext(
        _ plaintext: [UInt8], event: EmailReceived, key: AddressKey, prefix: [UInt8], frame: Frame
    ) -> [UInt8]? {
        let budget = maxPushPayloadBytes - prefix.count - payloadSuffixLength(frame: frame)
        let rsaBytes = key.rsaBytes
        guard let plaintextLimit = largestPlaintext(base64Budget: budget, algorithm: key.algorithm, rsaBytes: rsaBytes) else {
            return nil
        }
        guard plaintext.count > plaintextLimit else { return plaintext }
        var text = NotificationText(event)
        guard text.shorten(currentLength: plaintext.count, toFit: plaintextLimit) != nil else { return nil }
        return text.plaintext(event)
    }

    /// The payload serialized up to the base64 of the sealed bytes: `prefix ‖ base64 ‖ suffix` is the whole
    /// payload. Escaping works byte by byte and base64 needs none, so each part can be escaped on its own,
    /// however deeply the data string is nested:
    ///
    ///     data         = {"keyId":…,"algorithm":…,"type":"messageReceived","sealed":"<base64>"}
    ///     sudoplatform = {"servicename":"emService","data":"<data, escaped>"}
    ///     apns.payload = {"aps":{…},"sudoplatform":<sudoplatform>,"jobId":…}
    ///     fcm data     = {"sudoplatform":"<sudoplatform, escaped>","jobId":…}
    ///
    /// It depends on the key alone, so an email's jobs share it (`PreparedEmail`), and so do the key's next emails
    /// (`AddressKey.payloadFraming`).
    func payloadPrefix(key: AddressKey, frame: Frame) -> [UInt8] {
        var dataHead: [UInt8] = []
        dataHead.reserveCapacity(96 + key.keyId.utf8.count)
        dataHead.append(contentsOf: Self.keyIdHead)
        JSONWriter.appendQuoted(key.keyId, to: &dataHead)
        dataHead.append(contentsOf: key.algorithm == .rsaOAEPAESCBC ? Self.cbcTail : Self.gcmTail)

        var prefix: [UInt8] = []
        prefix.reserveCapacity(apnsHead.count + 2 * dataHead.count + 64)
        switch frame {
        case .apns:
            prefix.append(contentsOf: apnsHead)
            JSONWriter.appendEscaped(utf8: dataHead, to: &prefix)
        case .fcm:
            prefix.append(contentsOf: Self.fcmHead)
            var once: [UInt8] = []
            once.reserveCapacity(dataHead.count + 16)
            JSONWriter.appendEscaped(utf8: dataHead, to: &once)
            JSONWriter.appendEscaped(utf8: once, to: &prefix)
        }
        return prefix
    }

    /// Appends what follows the base64 of the sealed bytes: the closing of `data` (and `sudoplatform`), then
    /// the job id.
    static func appendPayloadSuffix(jobId: String, frame: Frame, to out: inout [UInt8]) {
        out.append(contentsOf: frame == .apns ? apnsTail : fcmTail)
        out.append(contentsOf: jobIdKey)
        JSONWriter.appendQuoted(jobId, to: &out)
        out.append(UInt8(ascii: "}"))
    }

    /// The length of what `appendPayloadSuffix` appends for any job id: `JobID.length` hex digits, which need no
    /// escaping. (Should a job id ever differ, `writeSealedPayload`'s size check still refuses an oversized push.)
    static func payloadSuffixLength(frame: Frame) -> Int {
        (frame == .apns ? apnsTail : fcmTail).count + jobIdKey.count + JobID.length + 3
    }

    // Constant fragments of the frame, derived from their unescaped forms so that the nested
    // escaping is done by the same code as everywhere else.
    static let sudoplatformHead: [UInt8] = Array(#"{"servicename":"emService","data":""#.utf8)
    private static let keyIdHead: [UInt8] = Array(#"{"keyId":"#.utf8)
    private static let cbcTail = dataTail(.rsaOAEPAESCBC)
    private static let gcmTail = dataTail(.rsaOAEP256AESGCM)
    private static let dataClose: [UInt8] = Array(#""}"#.utf8)
    /// `"}` closing `data`, escaped once, then `"}` closing sudoplatform.
    private static let apnsTail: [UInt8] = escaped(dataClose) + dataClose
    private static let fcmHead: [UInt8] = Array(#"{"sudoplatform":""#.utf8) + escaped(sudoplatformHead)
    private static let fcmTail: [UInt8] = escaped(escaped(dataClose)) + escaped(dataClose) + [UInt8(ascii: "\"")]
    private static let jobIdKey: [UInt8] = Array(#","jobId":"#.utf8)

    private static func dataTail(_ algorithm: SealingAlgorithm) -> [UInt8] {
        Array(#","algorithm":"\#(algorithm.rawValue)","type":"\#(EmailReceived.messageReceivedType)","sealed":""#.utf8)
    }

    private static func escaped(_ bytes: [UInt8]) -> [UInt8] {
        var out: [UInt8] = []
        JSONWriter.appendEscaped(utf8: bytes, to: &out)
        return out
    }

    /// The longest plaintext whose sealed base64 fits in `base64Budget` bytes, or `nil`.
    /// The sealed length only grows with the plaintext length, so binary search applies.
    static func largestPlaintext(base64Budget: Int, algorithm: SealingAlgorithm, rsaBytes: Int) -> Int? {
        func fits(_ n: Int) -> Bool {
            Base64.encodedLength(Sealer.sealedLength(plaintextCount: n, algorithm: algorithm, rsaBytes: rsaBytes)) <= base64Budget
        }
        guard fits(0) else { return nil }
        var low = 0 // fits
        var high = max(base64Budget, 1) // sealed ≥ plaintext, base64 ≥ sealed: does not fit
        while high - low > 1 {
            let mid = (low + high) / 2
            if fits(mid) { low = mid } else { high = mid }
        }
        return low
    }
}

extension NotificationText {
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
    static let ellipsisLength = ellipsis.utf8.count // 3, never escaped

    /// The longest prefix of whole Characters whose escaped UTF-8 length is ≤ `budget`, or `nil` if
    /// `budget` < 0. Every Character adds at least one byte, so the walk stops at the first one that does not
    /// fit: it reads at most `budget` + 1 Characters of the text (a few KB), however long the text is.
    static func longestPrefix(of text: String, fittingEscapedLength budget: Int) -> String? {
        guard budget >= 0 else { return nil }
        var total = 0
        var end = text.startIndex
        while end < text.endIndex {
            let next = text.index(after: end)
            total += JSONWriter.escapedLength(utf8: text.utf8[end..<next])
            if total > budget { break }
            end = next
        }
        return String(text[..<end])
    }
}
