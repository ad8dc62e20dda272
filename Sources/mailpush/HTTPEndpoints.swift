import FlyingFox
import FlyingSocks
import Foundation
import MailpushPipeline
import Prometheus
import ServiceLifecycle
import Synchronization

/// `/healthz`, `/readyz` and `/metrics` (Prometheus text format) on the --http-port.
///
/// `listen` binds the port before the service opens any other socket: the embedded development broker and
/// the Kafka clients take ephemeral ports, and one of them could otherwise take the port asked for here.
struct HTTPEndpoints: Service {
    let port: UInt16
    private let server: HTTPServer
    private let serving: Task<Void, any Error>

    static func listen(
        port: UInt16, health: HealthState, registry: PrometheusCollectorRegistry, livenessTimeout: Duration
    ) async throws -> HTTPEndpoints {
        let server = await makeServer(port: port, health: health, registry: registry, livenessTimeout: livenessTimeout)
        let failure = Mutex<(any Error)?>(nil)
        let serving = Task {
            do {
                try await server.run()
            } catch {
                failure.withLock { $0 = error }
                throw error
            }
        }
        // FlyingFox binds inside `run()`, and a failed bind ends it at once: watch for either.
        let deadline = ContinuousClock.now + .seconds(10)
        while await !server.isListening {
            if let error = failure.withLock({ $0 }) {
                throw HTTPPortUnavailable(port: port, detail: "\(error)")
            }
            guard ContinuousClock.now < deadline else {
                serving.cancel()
                throw HTTPPortUnavailable(port: port, detail: "not listening after 10 s")
            }
            try? await Task.sleep(for: .milliseconds(5))
        }
        // With --http-port 0 the system picks the port: the one bound is what the log must name.
        var bound = port
        switch await server.listeningAddress {
        case .ip4(_, let actual), .ip6(_, let actual): bound = actual
        default: break
        }
        return HTTPEndpoints(port: bound, server: server, serving: serving)
    }

    private static func makeServer(
        port: UInt16, health: HealthState, registry: PrometheusCollectorRegistry, livenessTimeout: Duration
    ) async -> HTTPServer {
        let server = HTTPServer(address: .inet(port: port), timeout: 15, logger: .disabled)
        await server.appendRoute("GET /healthz") { _ in
            health.isAlive(within: livenessTimeout)
                ? HTTPResponse(statusCode: .ok, body: Data("ok\n".utf8))
                : HTTPResponse(statusCode: .serviceUnavailable, body: Data("pipeline loop stalled\n".utf8))
        }
        await server.appendRoute("GET /readyz") { _ in
            let (ready, detail) = health.readiness
            return ready
                ? HTTPResponse(statusCode: .ok, body: Data("ready: \(detail)\n".utf8))
                : HTTPResponse(statusCode: .serviceUnavailable, body: Data("not ready: \(detail)\n".utf8))
        }
        await server.appendRoute("GET /metrics") { _ in
            HTTPResponse(
                statusCode: .ok, headers: [.contentType: "text/plain; version=0.0.4; charset=utf-8"],
                body: Data(registry.emitToBuffer()))
        }
        return server
    }

    /// Serves until the service group shuts down; the port is already bound by `listen`.
    func run() async throws {
        let server = server
        let serving = serving
        try await withTaskCancellationHandler {
            try await withGracefulShutdownHandler {
                do {
                    try await serving.value
                } catch is CancellationError {
                    // FlyingFox ends `run()` this way when stopped: that is the shutdown we asked for.
                } catch  where Task.isShuttingDownGracefully || Task.isCancelled {
                    // Same: any error after stop() was requested belongs to the shutdown.
                } catch {
                    throw HTTPPortUnavailable(port: port, detail: "\(error)")
                }
            } onGracefulShutdown: {
                Task { await server.stop(timeout: 1) }
            }
        } onCancel: {
            serving.cancel()
        }
    }
}

/// The HTTP port could not be opened (in use, or not permitted): a setting to fix, exit 64.
struct HTTPPortUnavailable: Error, CustomStringConvertible {
    var port: UInt16
    var detail: String
    var description: String { "--http-port \(port): cannot listen (\(detail))" }
}
