import Logging
import MailpushCore
import MailpushKafka
import MailpushState

/// The materialized config topics held in memory: devices by owner, keys by address.
/// The SQLite state holds the raw records; this is what the hot path reads.
struct ConfigDirectory: Sendable {
    enum KeyEntry: Sendable {
        case usable(AddressKey)
        /// A registered key mailpush cannot seal with; events for the address are dead letters until a usable one arrives.
        case rejected(reason: String)
    }

    private var devicesByOwner: [String: [String: DeviceRegistration]] = [:]
    private var ownerByDevice: [String: String] = [:]
    private var keysByAddress: [String: KeyEntry] = [:]

    var deviceCount: Int { ownerByDevice.count }
    var keyCount: Int { keysByAddress.count }

    /// Devices of `owner`, in deviceId order so a batch renders the same way every time.
    func devices(owner: String) -> [DeviceRegistration] {
        guard let devices = devicesByOwner[owner] else { return [] }
        return devices.keys.sorted().map { devices[$0]! }
    }

    func key(address: String) -> KeyEntry? { keysByAddress[address] }

    mutating func setDevice(_ registration: DeviceRegistration) {
        removeDevice(registration.deviceId)
        devicesByOwner[registration.owner, default: [:]][registration.deviceId] = registration
        ownerByDevice[registration.deviceId] = registration.owner
    }

    mutating func removeDevice(_ deviceId: String) {
        guard let owner = ownerByDevice.removeValue(forKey: deviceId) else { return }
        devicesByOwner[owner]?[deviceId] = nil
        if devicesByOwner[owner]?.isEmpty == true { devicesByOwner[owner] = nil }
    }

    mutating func setKey(_ entry: KeyEntry, address: String) { keysByAddress[address] = entry }
    mutating func removeKey(address: String) { keysByAddress[address] = nil }
}

/// What one config record means, decided from its bytes alone.
enum ConfigRecordMeaning {
    case device(DeviceRegistration, raw: [UInt8])
    case deviceRemoved(deviceId: String)
    case key(ConfigDirectory.KeyEntry, address: String, owner: String?, raw: [UInt8])
    case keyRemoved(address: String)
    /// Logged and counted; the previous registration, if any, stays in force.
    case skipped(reason: String)

    /// The meaning of a record of either config topic.
    static func of(_ record: KafkaRecord, topics: Topics) -> Self {
        record.topic == topics.devices
            ? .device(key: record.key, value: record.value)
            : .addressKey(key: record.key, value: record.value)
    }

    static func device(key: [UInt8]?, value: [UInt8]?) -> Self {
        guard let value else {
            guard let key, let deviceId = String(validating: key, as: UTF8.self), !deviceId.isEmpty else {
                return .skipped(reason: "tombstone without a deviceId key")
            }
            return .deviceRemoved(deviceId: deviceId)
        }
        do {
            let registration = try DeviceRegistration.decode(value)
            if let key, let keyString = String(validating: key, as: UTF8.self), keyString != registration.deviceId {
                return .skipped(reason: "record key \(keyString) does not match deviceId \(registration.deviceId)")
            }
            return .device(registration, raw: value)
        } catch {
            return .skipped(reason: error.reason)
        }
    }

    static func addressKey(key: [UInt8]?, value: [UInt8]?) -> Self {
        guard let value else {
            guard let key, let address = String(validating: key, as: UTF8.self), !address.isEmpty else {
                return .skipped(reason: "tombstone without an emailAddressId key")
            }
            return .keyRemoved(address: address)
        }
        // A record naming its address but carrying an unusable key replaces the old key (CONTRACT §5);
        // one that names no address cannot be attributed and is skipped.
        let object: [String: JSONValue]
        do {
            guard case .object(let parsed) = try JSONValue.parse(value) else {
                return .skipped(reason: "address key record is not a JSON object")
            }
            object = parsed
        } catch {
            return .skipped(reason: error.description)
        }
        guard case .string(let address)? = object["emailAddressId"], !address.isEmpty else {
            return .skipped(reason: "missing field emailAddressId")
        }
        if let key, let keyString = String(validating: key, as: UTF8.self), keyString != address {
            return .skipped(reason: "record key \(keyString) does not match emailAddressId \(address)")
        }
        var owner: String?
        if case .string(let value)? = object["owner"] { owner = value }
        do {
            return .key(.usable(try AddressKey.decode(value)), address: address, owner: owner, raw: value)
        } catch {
            return .key(.rejected(reason: error.reason), address: address, owner: owner, raw: value)
        }
    }

    var stateChange: ConfigChange? {
        switch self {
        case .device(let registration, let raw):
            ConfigChange(table: .devices, id: registration.deviceId, owner: registration.owner, value: raw)
        case .deviceRemoved(let deviceId):
            ConfigChange(table: .devices, id: deviceId, owner: nil, value: nil)
        case .key(_, let address, let owner, let raw):
            ConfigChange(table: .addressKeys, id: address, owner: owner, value: raw)
        case .keyRemoved(let address):
            ConfigChange(table: .addressKeys, id: address, owner: nil, value: nil)
        case .skipped:
            nil
        }
    }

    func apply(to directory: inout ConfigDirectory) {
        switch self {
        case .device(let registration, _): directory.setDevice(registration)
        case .deviceRemoved(let deviceId): directory.removeDevice(deviceId)
        case .key(let entry, let address, _, _): directory.setKey(entry, address: address)
        case .keyRemoved(let address): directory.removeKey(address: address)
        case .skipped: break
        }
    }
}

extension ConfigDirectory {
    /// Rebuilds the directory from the state store (start-up: no topic is re-read).
    static func load(from store: StateStore, logger: Logger) throws(StateError) -> ConfigDirectory {
        var directory = ConfigDirectory()
        for (deviceId, raw) in try store.devices() {
            let meaning = ConfigRecordMeaning.device(key: Array(deviceId.utf8), value: raw)
            if case .skipped(let reason) = meaning {
                logger.warning("stored device registration no longer valid, ignored", metadata: ["deviceId": "\(deviceId)", "reason": "\(reason)"])
            }
            meaning.apply(to: &directory)
        }
        for (address, raw) in try store.addressKeys() {
            ConfigRecordMeaning.addressKey(key: Array(address.utf8), value: raw).apply(to: &directory)
        }
        return directory
    }
}
