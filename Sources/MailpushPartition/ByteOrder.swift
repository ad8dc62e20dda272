extension String {
    /// Whether this string comes before `other` in the byte order of their UTF-8: the order of `JSONEncoder`'s
    /// sorted keys for the names written here (Kafka names are ASCII) and of SQLite's BINARY collation.
    ///
    /// Why not `utf8.lexicographicallyPrecedes(other.utf8)`: that walks both through generic iterators a byte at a
    /// time. Sorting a batch's 65 output-mark names with it (for each state record's JSON) took about 2% of a fleet
    /// member's CPU under a steady load of 1,500 events/s.
    public func precedesInByteOrder(_ other: String) -> Bool {
        var a = self
        var b = other
        return a.withUTF8 { x in
            b.withUTF8 { y in
                for index in 0..<Swift.min(x.count, y.count) where x[index] != y[index] {
                    return x[index] < y[index]
                }
                return x.count < y.count
            }
        }
    }
}
