import ArgumentParser
import Foundation
import MailpushCore

struct UnsealCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "unseal",
        abstract: "Open a push job's sealed payload the way the iOS Notification Service Extension does (debugging).",
        discussion:
            "Reads a PushJob JSON (or the notification data string) from FILE or standard input and prints the plaintext notification JSON."
    )

    @Option(help: "PEM file of the address's private key (PKCS#8 or PKCS#1).") var privateKey: String
    @Argument(help: "File holding the job; standard input when absent or -.") var file: String?

    func run() throws {
        let pem: String
        do {
            pem = try String(contentsOfFile: privateKey, encoding: .utf8)
        } catch {
            throw fail("--private-key: cannot read \(privateKey): \(error.localizedDescription)", ExitStatus.usage)
        }
        let input: Data
        if let file, file != "-" {
            guard let data = FileManager.default.contents(atPath: file) else { throw fail("cannot read \(file)", ExitStatus.usage) }
            input = data
        } else {
            input = FileHandle.standardInput.readDataToEndOfFile()
        }
        let bytes = [UInt8](input)
        do {
            let plaintext: [UInt8]
            if let text = String(validating: bytes, as: UTF8.self), text.contains("\"sealed\""), !text.contains("\"version\"") {
                plaintext = try Unsealer.open(notificationData: text.trimmingCharacters(in: .whitespacesAndNewlines), privateKeyPEM: pem)
            } else {
                plaintext = try Unsealer.open(pushJob: bytes, privateKeyPEM: pem)
            }
            FileHandle.standardOutput.write(Data(plaintext + [UInt8(ascii: "\n")]))
        } catch {
            throw fail("cannot open the payload: \(error)", ExitStatus.usage)
        }
    }
}
