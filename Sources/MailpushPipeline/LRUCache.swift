/// At most `capacity` values weighing at most `maxWeight` together, the least recently used one leaving
/// first. Every operation is O(1) but the evictions it causes: the entries live in one array, linked from
/// most to least recently used by index.
struct LRUCache<Key: Hashable, Value> {
    private struct Entry {
        var key: Key
        /// nil once removed: a free slot must not keep its old value alive until it is reused.
        var value: Value?
        var weight: Int
        var newer: Int?
        var older: Int?
    }

    let capacity: Int
    let maxWeight: Int
    private(set) var totalWeight = 0
    private var slots: [Key: Int] = [:]
    private var entries: [Entry] = []
    private var free: [Int] = []
    private var newest: Int?
    private var oldest: Int?

    init(capacity: Int, maxWeight: Int = .max) {
        precondition(capacity >= 1 && maxWeight >= 1)
        self.capacity = capacity
        self.maxWeight = maxWeight
    }

    var count: Int { slots.count }

    /// The value of `key`, which becomes the most recently used.
    mutating func get(_ key: Key) -> Value? {
        guard let slot = slots[key] else { return nil }
        unlink(slot)
        linkNewest(slot)
        return entries[slot].value
    }

    /// Stores `value` as the most recently used; returns what had to leave to make room, oldest first. A value
    /// heavier than `maxWeight` is not stored: it is returned as evicted, after the key's old value.
    @discardableResult
    mutating func set(_ key: Key, _ value: Value, weight: Int = 1) -> [(key: Key, value: Value)] {
        var evicted: [(key: Key, value: Value)] = []
        if let old = remove(key), weight > maxWeight { evicted.append((key, old)) }
        guard weight <= maxWeight else { return evicted + [(key, value)] }
        while slots.count >= capacity || totalWeight + weight > maxWeight, let victim = oldest {
            let victimKey = entries[victim].key
            if let value = remove(victimKey) { evicted.append((victimKey, value)) }
        }
        let entry = Entry(key: key, value: value, weight: weight, newer: nil, older: nil)
        let slot: Int
        if let reused = free.popLast() {
            entries[reused] = entry
            slot = reused
        } else {
            entries.append(entry)
            slot = entries.count - 1
        }
        slots[key] = slot
        totalWeight += weight
        linkNewest(slot)
        return evicted
    }

    @discardableResult
    mutating func remove(_ key: Key) -> Value? {
        guard let slot = slots.removeValue(forKey: key) else { return nil }
        unlink(slot)
        free.append(slot)
        totalWeight -= entries[slot].weight
        defer { entries[slot].value = nil }
        return entries[slot].value
    }

    /// Keys from the most to the least recently used (for tests and diagnostics).
    var keysByRecency: [Key] {
        var keys: [Key] = []
        var cursor = newest
        while let slot = cursor {
            keys.append(entries[slot].key)
            cursor = entries[slot].older
        }
        return keys
    }

    private mutating func unlink(_ slot: Int) {
        let (newer, older) = (entries[slot].newer, entries[slot].older)
        if let newer { entries[newer].older = older } else { newest = older }
        if let older { entries[older].newer = newer } else { oldest = newer }
        entries[slot].newer = nil
        entries[slot].older = nil
    }

    private mutating func linkNewest(_ slot: Int) {
        entries[slot].older = newest
        if let newest { entries[newest].newer = slot }
        newest = slot
        if oldest == nil { oldest = slot }
    }
}
