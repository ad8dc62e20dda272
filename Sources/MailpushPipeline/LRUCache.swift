/// At most `capacity` values, the least recently used one leaving first. Every operation is O(1): the
/// entries live in one array, linked from most to least recently used by index.
struct LRUCache<Key: Hashable, Value> {
    private struct Entry {
        var key: Key
        var value: Value
        var newer: Int?
        var older: Int?
    }

    let capacity: Int
    private var slots: [Key: Int] = [:]
    private var entries: [Entry] = []
    private var free: [Int] = []
    private var newest: Int?
    private var oldest: Int?

    init(capacity: Int) {
        precondition(capacity >= 1)
        self.capacity = capacity
    }

    var count: Int { slots.count }

    /// The value of `key`, which becomes the most recently used.
    mutating func get(_ key: Key) -> Value? {
        guard let slot = slots[key] else { return nil }
        unlink(slot)
        linkNewest(slot)
        return entries[slot].value
    }

    /// Stores `value` as the most recently used; returns what had to leave to make room.
    @discardableResult
    mutating func set(_ key: Key, _ value: Value) -> (key: Key, value: Value)? {
        if let slot = slots[key] {
            entries[slot].value = value
            unlink(slot)
            linkNewest(slot)
            return nil
        }
        var evicted: (key: Key, value: Value)?
        if slots.count >= capacity, let victim = oldest {
            evicted = (entries[victim].key, entries[victim].value)
            remove(entries[victim].key)
        }
        let entry = Entry(key: key, value: value, newer: nil, older: nil)
        let slot: Int
        if let reused = free.popLast() {
            entries[reused] = entry
            slot = reused
        } else {
            entries.append(entry)
            slot = entries.count - 1
        }
        slots[key] = slot
        linkNewest(slot)
        return evicted
    }

    @discardableResult
    mutating func remove(_ key: Key) -> Value? {
        guard let slot = slots.removeValue(forKey: key) else { return nil }
        unlink(slot)
        free.append(slot)
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
