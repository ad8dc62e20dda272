// swift-tools-version:6.0
import PackageDescription

// Layering (nothing below imports anything above it; docs/architecture.md has the whole picture):
//   mailpush (CLI, HTTP, lifecycle)
//   MailpushPipeline (ingest, state, produce, recovery)
//   MailpushCore (pure domain)   MailpushKafka (all librdkafka calls)   MailpushState (SQLite)
//   MailpushPartition (the TopicPartition value both Kafka and State name; no dependencies)
//   MailpushMultiBufferRSA (Intel's libcrypto_mb through dlopen, under MailpushCore; no dependencies)

/// One set of compiler settings for every Swift target, so every module is checked by the same rules.
/// (Strict concurrency checking is already on: it is the Swift 6 language mode's default.)
let swiftSettings: [SwiftSetting] = [
    .enableUpcomingFeature("ExistentialAny")
]

let package = Package(
    name: "mailpush",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "mailpush", targets: ["mailpush"])
    ],
    // Exact pins, and no Package.resolved in git: a committed one names one machine's mirror revisions.
    dependencies: [
        .package(url: "https://github.com/apple/swift-crypto.git", exact: "3.12.3"),
        .package(url: "https://github.com/apple/swift-argument-parser.git", exact: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log.git", exact: "1.16.2"),
        .package(url: "https://github.com/apple/swift-metrics.git", exact: "2.13.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus.git", exact: "2.4.1"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", exact: "2.13.0"),
        .package(url: "https://github.com/groue/GRDB.swift.git", exact: "7.10.0"),
        .package(url: "https://github.com/swhitty/FlyingFox.git", exact: "0.27.1"),
        .package(url: "https://github.com/apple/swift-asn1.git", exact: "1.7.4"),
        .package(url: "https://github.com/swift-extras/swift-extras-base64.git", exact: "1.2.0"),
    ],
    targets: [
        .systemLibrary(
            name: "CRdKafka",
            pkgConfig: "rdkafka",
            providers: [.apt(["librdkafka-dev"])]
        ),
        .target(name: "MailpushPartition", swiftSettings: swiftSettings),
        // jemalloc as the service's allocator, with its settings (docs/operations.md, "Memory allocator").
        .target(
            name: "MailpushAllocator",
            linkerSettings: [.linkedLibrary("jemalloc", .when(platforms: [.linux]))]
        ),
        .target(
            name: "MailpushKafka",
            dependencies: ["CRdKafka", "MailpushPartition"],
            swiftSettings: swiftSettings
        ),
        // Intel's multi-buffer RSA, loaded at run time when installed (docs/operations.md, "RSA eight at a time").
        .target(name: "MailpushMultiBufferRSA", swiftSettings: swiftSettings),
        .target(
            name: "MailpushCore",
            dependencies: [
                "MailpushMultiBufferRSA",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "_CryptoExtras", package: "swift-crypto"),
                .product(name: "SwiftASN1", package: "swift-asn1"),
            ],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "MailpushState",
            dependencies: ["MailpushPartition", .product(name: "GRDB", package: "GRDB.swift")],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "MailpushPipeline",
            dependencies: [
                "MailpushMultiBufferRSA",
                "MailpushCore", "MailpushKafka", "MailpushPartition", "MailpushState",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
            ],
            swiftSettings: swiftSettings
        ),
        .executableTarget(
            name: "mailpush",
            dependencies: [
                "MailpushMultiBufferRSA",
                "MailpushAllocator", "MailpushPipeline", "MailpushPartition", "MailpushCore", "MailpushKafka", "MailpushState",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "FlyingFox", package: "FlyingFox"),
                .product(name: "FlyingSocks", package: "FlyingFox"),
            ],
            swiftSettings: swiftSettings
        ),
        .executableTarget(
            name: "MailpushBench",
            dependencies: [
                "MailpushMultiBufferRSA",
                "MailpushPipeline", "MailpushCore", "MailpushKafka", "MailpushPartition", "MailpushState",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "_CryptoExtras", package: "swift-crypto"),
                // Only to compare the hand-written base64 with it.
                .product(name: "ExtrasBase64", package: "swift-extras-base64"),
            ],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "MailpushTestSupport",
            dependencies: ["MailpushCore", "MailpushKafka"],
            // The contract's test vectors, so that a clone tests itself with nothing beside it.
            resources: [.copy("Vectors")],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "MailpushCoreTests",
            dependencies: [
                "MailpushCore", "MailpushMultiBufferRSA", "MailpushTestSupport", .product(name: "_CryptoExtras", package: "swift-crypto"),
            ],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "MailpushKafkaTests",
            dependencies: ["MailpushKafka", "MailpushPartition", "MailpushTestSupport"],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "MailpushStateTests",
            dependencies: ["MailpushState", "MailpushPartition", "MailpushTestSupport", .product(name: "GRDB", package: "GRDB.swift")],
            resources: [.copy("Fixtures")],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "MailpushPipelineTests",
            dependencies: [
                "MailpushPipeline", "MailpushCore", "MailpushKafka", "MailpushPartition", "MailpushState", "MailpushTestSupport",
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
    ]
)
