import MailpushPartition
import Testing

@Suite struct ByteOrderTests {
    @Test func ordersByTheBytesOfTheUTF8LikeTheGenericComparison() {
        let names = [
            "mailpush.push-jobs/10", "mailpush.push-jobs/2", "mailpush.push-jobs/1", "mailpush.dead-letters/0", "", "a", "ab",
            "B", "é", "e\u{301}", "z", "😀", "mailpush.push-jobs",
        ]
        let expected = names.sorted { $0.utf8.lexicographicallyPrecedes($1.utf8) }
        #expect(names.sorted { $0.precedesInByteOrder($1) } == expected)
        #expect(expected.prefix(4) == ["", "B", "a", "ab"])
        for a in names {
            #expect(!a.precedesInByteOrder(a))
            for b in names {
                #expect(a.precedesInByteOrder(b) == a.utf8.lexicographicallyPrecedes(b.utf8), "\(a) against \(b)")
            }
        }
    }

    @Test func canonicallyEqualStringsStillHaveAByteOrder() {
        // Swift's `<` compares canonical equivalents as equal; JSON sorted keys and SQLite compare bytes.
        let composed = "é"
        let decomposed = "e\u{301}"
        #expect(!(composed < decomposed) && !(decomposed < composed))
        #expect(decomposed.precedesInByteOrder(composed))
        #expect(!composed.precedesInByteOrder(decomposed))
    }
}
