import Logging
import MailpushCore
import MailpushKafka
import MailpushState
import Synchronization

/// What a batch needs of the config: the devices of its events' owners and the keys of their addresses.
struct ConfigView: Sendable {
    var devicesByOwner: [String: [DeviceRegistration]] = [:]
    var keysByAddress: [String: ConfigDirectory.KeyEntry] = [:]
    /// Owners whose devices are too many to hold at once, so not in `devicesByOwner`: read them with
    /// `forEachDevicePage`.
    var pagedOwners: Set<String> = []
    var directory: ConfigDirectory?

    /// Devices of `owner`, in deviceId byte order so a batch renders the same way every time.
    func devices(owner: String) -> [DeviceRegistration] { devicesByOwner[owner] ?? [] }
    func key(address: String) -> ConfigDirectory.KeyEntry? { keysByAddress[address] }
    func usableKey(address: String) -> AddressKey? { keysByAddress[address]?.usable }

    /// The devices of one of `pagedOwners`, a page at a time.
    func forEachDevicePage(owner: String, _ body: ([DeviceRegistration]) -> Void) throws(StateError) {
        try directory?.forEachDevicePage(owner: owner, body)
    }

    /// What the emails of one of `pagedOwners` wanted, as far as known (`ConfigDirectory.pagedWants(owner:)`).
    func knownPagedWants(owner: String) -> (known: ConfigDirectory.PagedWants?, changes: Int) {
        directory?.pagedWants(owner: owner) ?? (nil, 0)
    }

    func keep(_ wants: ConfigDirectory.PagedWants, owner: String, ifNoChangeSince changes: Int) {
        directory?.keep(wants, owner: owner, ifNoChangeSince: changes)
    }
}

/// The materialized config topics as the hot path reads them. The registrations live in the SQLite state
/// (as the raw records, devices indexed by owner); a batch fetches what its owners and addresses need in
/// one read, and the parsed registrations and keys of recently seen owners and addresses stay in a bounded
/// LRU cache (a parsed RSA key is the expensive part). So a restart loads nothing, and memory does not grow
/// with the number of registered devices, nor with how many one owner has: an owner whose registrations
/// are too large to hold whole, and the owners of a batch beyond what it may hold, are read a page at a time
/// and never cached whole: what their emails wanted is (`PagedWants`).
///
/// Every applied config change drops the cache entries it touches, so what the broker acknowledged before
/// a batch's catch-up applies to that batch (CONTRACT §8).
final class ConfigDirectory: Sendable {
    enum KeyEntry: Sendable {
        case usable(AddressKey)
        /// A registered key mailpush cannot seal with; events for the address are dead letters until a usable one arrives.
        case rejected(reason: String)

        var usable: AddressKey? { if case .usable(let key) = self { key } else { nil } }
    }

    /// How many owners (with their devices) and addresses (with their key) stay parsed in memory.
    struct CacheCapacity: Sendable {
        var owners = 20_000
        var addresses = 10_000
        /// The registrations of the cached owners' devices together, in stored bytes; also how much one batch
        /// reads whole. A registration at the contract's limits is about 130 KB stored and twice that parsed; an
        /// ordinary one (a few filter items) under 1 KB, so this holds about as many owners as `owners`.
        var deviceBytes = 32 << 20
        /// An owner whose registrations come to more is never held whole: a batch reads its devices in pages
        /// of about this many stored bytes.
        var ownerPageBytes = 4 << 20
        /// What the emails of such owners wanted (`PagedWants`) together, about.
        var pagedWantsBytes = 16 << 20
    }

    /// What the emails of an owner read page by page wanted, by filter meta (the devices without their filters),
    /// and which devices the owner had: reading them again takes about a second per 500 registrations at the
    /// contract's limits, and an owner's emails mostly share a meta (one address, one folder). Kept until any of
    /// the owner's devices changes.
    struct PagedWants: Sendable {
        var byMeta: [FilterMeta: DeviceWants] = [:]
        var deviceIds: [String] = []

        var bytes: Int { byMeta.values.reduce(deviceIds.reduce(256) { $0 + 64 + $1.utf8.count }) { $0 + $1.bytes } }
    }

    private struct Cache {
        var owners: LRUCache<String, [DeviceRegistration]>
        /// nil: the address has no key.
        var keys: LRUCache<String, KeyEntry?>
        /// The owner under which each cached device is listed: a device that moves or goes must drop its old
        /// owner's entry, which the change itself does not name.
        var ownerOfCachedDevice: [String: String] = [:]
        var pagedWants: LRUCache<String, PagedWants>
        /// As `ownerOfCachedDevice`, for the devices of the owners in `pagedWants`.
        var ownerOfPagedDevice: [String: String] = [:]
        /// Counts the applied changes of devices: wants worked out from a read that began before one are not kept.
        var deviceChanges = 0

        mutating func cache(owner: String, devices: [DeviceRegistration], bytes: Int) {
            for device in devices { ownerOfCachedDevice[device.deviceId] = owner }
            // An entry's own cost beside its registrations.
            for evicted in owners.set(owner, devices, weight: bytes + 256) { forget(owner: evicted.key, devices: evicted.value) }
        }

        mutating func dropOwner(_ owner: String) {
            if let devices = owners.remove(owner) { forget(owner: owner, devices: devices) }
            if let wants = pagedWants.remove(owner) { forget(pagedOwner: owner, wants: wants) }
        }

        mutating func cache(pagedOwner owner: String, wants: PagedWants) {
            for deviceId in wants.deviceIds { ownerOfPagedDevice[deviceId] = owner }
            for evicted in pagedWants.set(owner, wants, weight: wants.bytes) { forget(pagedOwner: evicted.key, wants: evicted.value) }
        }

        /// Drops the entries of the owner a changed device was listed under, whichever cache it is in.
        mutating func dropPreviousOwner(ofDevice deviceId: String) {
            if let previous = ownerOfCachedDevice[deviceId] { dropOwner(previous) }
            if let previous = ownerOfPagedDevice[deviceId] { dropOwner(previous) }
        }

        private mutating func forget(pagedOwner owner: String, wants: PagedWants) {
            for deviceId in wants.deviceIds where ownerOfPagedDevice[deviceId] == owner {
                ownerOfPagedDevice[deviceId] = nil
            }
        }

        private mutating func forget(owner: String, devices: [DeviceRegistration]) {
            for device in devices where ownerOfCachedDevice[device.deviceId] == owner {
                ownerOfCachedDevice[device.deviceId] = nil
            }
        }
    }

    private let store: StateStore
    private let log: RecordLog
    private let cache: Mutex<Cache>
    private let capacity: CacheCapacity

    init(store: StateStore, capacity: CacheCapacity = CacheCapacity(), log: RecordLog) {
        self.store = store
        self.log = log
        self.capacity = capacity
        cache = Mutex(
            Cache(
                owners: LRUCache(capacity: capacity.owners, maxWeight: capacity.deviceBytes),
                keys: LRUCache(capacity: capacity.addresses),
                pagedWants: LRUCache(capacity: capacity.owners, maxWeight: capacity.pagedWantsBytes)))
    }

    /// The devices of `owners` and the keys of `addresses`: from the cache, the rest in one read of the state.
    func view(owners: Set<String>, addresses: Set<String>) throws(StateError) -> ConfigView {
        try cache.withLock { cache throws(StateError) -> ConfigView in
            var view = ConfigView()
            var missingOwners: [String] = []
            for owner in owners {
                if let devices = cache.owners.get(owner) {
                    view.devicesByOwner[owner] = devices
                } else if cache.pagedWants.get(owner) != nil {
                    // Its devices have not changed since they were last read: still too large to hold whole.
                    view.pagedOwners.insert(owner)
                } else {
                    missingOwners.append(owner)
                }
            }
            var missingAddresses: [String] = []
            for address in addresses {
                if let entry = cache.keys.get(address) { view.keysByAddress[address] = entry } else { missingAddresses.append(address) }
            }
            if !missingOwners.isEmpty {
                let stored = try store.devices(owners: missingOwners, ownerBytes: capacity.ownerPageBytes, totalBytes: capacity.deviceBytes)
                view.pagedOwners.formUnion(stored.unread)
                for (owner, devices) in decodeDevices(stored, owners: missingOwners.filter { !view.pagedOwners.contains($0) }) {
                    cache.cache(owner: owner, devices: devices, bytes: stored.bytesByOwner[owner] ?? 0)
                    if !devices.isEmpty { view.devicesByOwner[owner] = devices }
                }
                for owner in stored.tooLarge {
                    log.log(
                        .notice, "an owner's device registrations are too large to hold whole: read page by page",
                        countedIn: "logged again whenever they are read again: after any of them changed",
                        metadata: ["owner": "\(owner)", "moreThanBytes": "\(capacity.ownerPageBytes)"])
                }
            }
            if !view.pagedOwners.isEmpty { view.directory = self }
            if !missingAddresses.isEmpty {
                for (address, entry) in try loadKeys(of: missingAddresses) {
                    cache.keys.set(address, entry)
                    view.keysByAddress[address] = entry
                }
            }
            return view
        }
    }

    /// The devices of `owner`, a page of about `ownerPageBytes` stored bytes at a time, in deviceId byte order, from
    /// one snapshot of the state; nothing is cached.
    func forEachDevicePage(owner: String, _ body: ([DeviceRegistration]) -> Void) throws(StateError) {
        try store.forEachDevicePage(owner: owner, pageBytes: capacity.ownerPageBytes) { rows in
            body(rows.compactMap { row in decodeStored(deviceId: row.deviceId, owner: owner, registration: row.registration) })
        }
    }

    /// What the emails of `owner`, whose devices are read page by page, wanted since its devices last changed, and
    /// a count of device changes to give `keep` with what a read begun now finds.
    func pagedWants(owner: String) -> (known: PagedWants?, changes: Int) {
        cache.withLock { cache in (cache.pagedWants.get(owner), cache.deviceChanges) }
    }

    /// Keeps what a read of `owner`'s devices found its emails want, joined to what is kept already, unless a
    /// device changed since the read began (`changes`, from `pagedWants(owner:)` before it).
    func keep(_ wants: PagedWants, owner: String, ifNoChangeSince changes: Int) {
        cache.withLock { cache in
            guard cache.deviceChanges == changes else { return }
            var joined = cache.pagedWants.get(owner) ?? PagedWants()
            joined.byMeta.merge(wants.byMeta) { _, new in new }
            joined.deviceIds = wants.deviceIds
            cache.cache(pagedOwner: owner, wants: joined)
        }
    }

    /// Takes applied config changes into account: drops the cache entries they touch. Called after the changes
    /// are stored.
    func apply(_ meanings: [ConfigRecordMeaning]) {
        cache.withLock { cache in
            for meaning in meanings {
                switch meaning {
                case .device(let registration, _):
                    cache.dropPreviousOwner(ofDevice: registration.deviceId)
                    cache.dropOwner(registration.owner)
                    cache.deviceChanges += 1
                case .deviceRemoved(let deviceId):
                    cache.dropPreviousOwner(ofDevice: deviceId)
                    cache.deviceChanges += 1
                case .key(_, let address, _, _), .keyRemoved(let address):
                    cache.keys.remove(address)
                case .skipped:
                    break
                }
            }
        }
    }

    /// Stored counts, for the logs.
    func counts() throws(StateError) -> (devices: Int, addressKeys: Int) { try store.configCounts() }

    /// The devices of `owners`, all of them read whole in `stored` (an owner without any gets an empty list); rows in
    /// deviceId byte order, which the devices keep.
    private func decodeDevices(_ stored: StateStore.DevicesOfOwners, owners: [String]) -> [String: [DeviceRegistration]] {
        var found = Dictionary(uniqueKeysWithValues: owners.map { ($0, [DeviceRegistration]()) })
        for row in stored.rows {
            if let registration = decodeStored(deviceId: row.deviceId, owner: row.owner, registration: row.registration) {
                found[row.owner, default: []].append(registration)
            }
        }
        return found
    }

    /// A stored registration as the service uses it: nil when it is no longer valid (logged).
    private func decodeStored(deviceId: String, owner: String, registration: [UInt8]) -> DeviceRegistration? {
        switch ConfigRecordMeaning.device(key: Array(deviceId.utf8), value: registration) {
        case .device(let registration, _) where registration.owner == owner:
            return registration
        case .skipped(let reason):
            log.log(
                .warning, "stored device registration no longer valid, ignored",
                countedIn: "each is logged again whenever its owner's devices are read",
                metadata: ["deviceId": "\(deviceId)", "reason": "\(reason)"])
            return nil
        default:
            return nil
        }
    }

    private func loadKeys(of addresses: [String]) throws(StateError) -> [String: KeyEntry?] {
        var found = [String: KeyEntry?](uniqueKeysWithValues: addresses.map { ($0, KeyEntry?.none) })
        for row in try store.addressKeys(addresses: addresses) {
            if case .key(let entry, _, _, _) = ConfigRecordMeaning.addressKey(key: Array(row.emailAddressId.utf8), value: row.record) {
                found[row.emailAddressId] = entry
            }
        }
        return found
    }
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
                return .skipped(
                    reason: "record key \(quotedForError(keyString)) does not match deviceId \(quotedForError(registration.deviceId))")
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
            return .skipped(reason: "record key \(quotedForError(keyString)) does not match emailAddressId \(quotedForError(address))")
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
}
