import MailpushCore
import MailpushTestSupport
import Testing

@Suite struct DedupeKeyTests {
    /// Keys are stored in the state file: a change would let every email of the window through again.
    @Test func keyIsStable() {
        #expect(DedupeKey.make(emailAddressId: "em-1", messageId: "m-0") == "fd211f6908825210d95e08225201ec31")
    }

    @Test func theSeparatorKeepsDifferentEmailsApart() {
        #expect(DedupeKey.make(emailAddressId: "ab", messageId: "c") != DedupeKey.make(emailAddressId: "a", messageId: "bc"))
        #expect(DedupeKey.make(emailAddressId: "em-1", messageId: "m-0") != DedupeKey.make(emailAddressId: "em-2", messageId: "m-0"))
    }

    @Test func sameEmailSameKeyWhateverElseDiffers() throws {
        let one = try EmailReceived.decode(Fixtures.event().bytes)
        let other = try EmailReceived.decode(
            Fixtures.event().setting("subject", .string("another subject")).setting("folderId", .string("f-9")).bytes)
        #expect(DedupeKey.of(one) == DedupeKey.of(other))
        #expect(DedupeKey.of(one) == DedupeKey.make(emailAddressId: one.emailAddressId, messageId: one.messageId))
        #expect(DedupeKey.of(one).utf8.count == 32)
    }
}
