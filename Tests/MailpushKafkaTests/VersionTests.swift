import MailpushKafka
import Testing

@Suite("librdkafka version check")
struct VersionTests {
    @Test func decodesLibrdkafkasEncoding() {
        let version = LibrdkafkaVersion(encoded: 0x0200_02ff)
        #expect((version.major, version.minor, version.revision) == (2, 0, 2))
        #expect(version.description == "2.0.2")
    }

    @Test(arguments: [
        (0x0200_02ff as UInt32, 0x0200_02ff as UInt32, true), // same release
        (0x0200_0200, 0x0200_02ff, true), // a pre-release build of the same release
        (0x0200_03ff, 0x0200_02ff, true), // newer revision
        (0x0201_00ff, 0x0200_09ff, true), // newer minor beats a higher revision
        (0x0300_00ff, 0x0209_09ff, true), // newer major
        (0x0200_01ff, 0x0200_02ff, false), // older revision
        (0x0109_09ff, 0x0200_00ff, false), // older major
        (0x0200_09ff, 0x0201_00ff, false), // older minor despite a higher revision
    ])
    func olderRuntimeThanHeadersIsRefused(runtime: UInt32, headers: UInt32, accepted: Bool) {
        #expect(LibrdkafkaVersion.runtime(LibrdkafkaVersion(encoded: runtime), satisfies: LibrdkafkaVersion(encoded: headers)) == accepted)
    }

    @Test func thisProcessLoadedAUsableLibrary() {
        #expect(LibrdkafkaVersion.runtime(.runtime, satisfies: .headers))
        #expect(LibrdkafkaVersion.runtimeString.hasPrefix(LibrdkafkaVersion.runtime.description))
    }
}
