import Crypto
import _CryptoExtras

/// Why a notification could not be opened.
public struct UnsealError: Error, CustomStringConvertible, Sendable, Equatable {
    public let reason: String
    public init(_ reason: String) { self.reason = reason }
    public var description: String { reason }
}

/// Opens sealed notifications the way a client does (an iOS Notification Service Extension,
/// an Android FCM service). Used by `mailpush unseal` and by tests; never on the hot path.
public enum Unsealer {
    /// Opens the notification `data` string: `{"keyId","algorithm","type","sealed"}`.
    public static func open(notificationData: String, privateKeyPEM: String) throws -> [UInt8] {
        let privateKey: _RSA.Encryption.PrivateKey
        do {
            privateKey = try _RSA.Encryption.PrivateKey(pemRepresentation: privateKeyPEM)
        } catch {
            throw UnsealError("private key is not an RSA private key in PEM form (\(error))")
        }
        return try open(notificationData: notificationData, privateKey: privateKey)
    }

    public static func open(notificationData: String, privateKey: _RSA.Encryption.PrivateKey) throws -> [UInt8] {
        let data: JSONValue
        do {
            data = try JSONValue.parse(notificationData)
        } catch {
            throw UnsealError("notification data: \(error)")
        }
        guard let algorithmText = data["algorithm"]?.stringValue else {
            throw UnsealError("notification data has no algorithm")
        }
        guard let algorithm = SealingAlgorithm(rawValue: algorithmText) else {
            throw UnsealError("unsupported algorithm \(quotedForError(algorithmText))")
        }
        guard let keyId = data["keyId"]?.stringValue else { throw UnsealError("notification data has no keyId") }
        guard let sealedText = data["sealed"]?.stringValue else { throw UnsealError("notification data has no sealed") }
        guard let sealed = Base64.decode(sealedText) else { throw UnsealError("sealed is not valid base64") }
        return try open(sealed: sealed, algorithm: algorithm, keyId: keyId, privateKey: privateKey)
    }

    /// Opens raw sealed bytes (CONTRACT §6).
    public static func open(
        sealed: [UInt8], algorithm: SealingAlgorithm, keyId: String,
        privateKey: _RSA.Encryption.PrivateKey
    ) throws -> [UInt8] {
        let rsaBytes = privateKey.keySizeInBits / 8
        guard sealed.count > rsaBytes else { throw UnsealError("sealed payload is too short for the key") }
        let wrappedKey = sealed[..<rsaBytes]
        let body = sealed[rsaBytes...]
        let rawKey: [UInt8]
        do {
            rawKey = [UInt8](try privateKey.decrypt(wrappedKey, padding: algorithm.oaepPadding))
        } catch {
            throw UnsealError("cannot unwrap the AES key: wrong private key or algorithm")
        }
        guard rawKey.count == Sealer.aesKeyLength else { throw UnsealError("unwrapped AES key has \(rawKey.count) bytes, not 32") }
        let aesKey = SymmetricKey(data: rawKey)
        switch algorithm {
        case .rsaOAEPAESCBC:
            do {
                let iv = try AES._CBC.IV(ivBytes: Sealer.zeroIV)
                return [UInt8](try AES._CBC.decrypt(body, using: aesKey, iv: iv))
            } catch {
                throw UnsealError("AES-CBC decryption failed (bad padding)")
            }
        case .rsaOAEP256AESGCM:
            do {
                let box = try AES.GCM.SealedBox(combined: body)
                return [UInt8](try AES.GCM.open(box, using: aesKey, authenticating: Array(keyId.utf8)))
            } catch {
                throw UnsealError("AES-GCM authentication failed (wrong keyId or tampered payload)")
            }
        }
    }

    /// Finds the sudoplatform data in a push job (`apns.payload.sudoplatform.data`, or the
    /// `fcm.message.data.sudoplatform` JSON string) and opens it.
    public static func open(pushJob: [UInt8], privateKeyPEM: String) throws -> [UInt8] {
        try open(notificationData: notificationData(inPushJob: pushJob), privateKeyPEM: privateKeyPEM)
    }

    /// The notification `data` string of a push job, as a client would receive it.
    public static func notificationData(inPushJob pushJob: [UInt8]) throws -> String {
        let job: JSONValue
        do {
            job = try JSONValue.parse(pushJob)
        } catch {
            throw UnsealError("push job: \(error)")
        }
        let sudoplatform: JSONValue
        if let apnsValue = job["apns"]?["payload"]?["sudoplatform"] {
            sudoplatform = apnsValue
        } else if let fcmText = job["fcm"]?["message"]?["data"]?["sudoplatform"]?.stringValue {
            // FCM data values are strings, so the object travels as JSON text.
            do {
                sudoplatform = try JSONValue.parse(fcmText)
            } catch {
                throw UnsealError("fcm sudoplatform: \(error)")
            }
        } else {
            throw UnsealError("push job carries no sudoplatform data (webhook jobs carry no sealed payload)")
        }
        guard let data = sudoplatform["data"]?.stringValue else {
            throw UnsealError("sudoplatform has no data string")
        }
        return data
    }
}
