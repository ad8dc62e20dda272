import FlyingFox
import FlyingSocks
import Foundation
import MailpushPipeline
import Prometheus
import ServiceLifecycle

/// `/healthz`, `/readyz` and `/metrics` (Prometheus text format) on the --http-port.
struct HTTPEndpoints: Service {
    let port: UInt16
    let health: HealthState
    let registry: PrometheusCollectorRegistry
    let livenessTimeout: Duration

    func makeServer() async -> HTTPServer {
        let server = HTTPServer(address: .inet(port: port), timeout: 15, logger: .disabled)
        let health = health
        let registry = registry
        let livenessTimeout = livenessTimeout
        do {
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
        }
        return server
    }

    func run() async throws {
        let server = await makeServer()
        try await withGracefulShutdownHandler {
            do {
                try await server.run()
            } catch is CancellationError {
                // FlyingFox ends `run()` this way when stopped: that is the shutdown we asked for.
            } catch  where Task.isShuttingDownGracefully {
                // Same: any error after stop() was requested belongs to the shutdown.
            } catch {
                throw HTTPPortUnavailable(port: port, detail: "\(error)")
            }
        } onGracefulShutdown: {
            Task { await server.stop(timeout: 1) }
        }
    }
}

/// The HTTP port could not be opened (in use, or not permitted): a setting to fix, exit 64.
struct HTTPPortUnavailable: Error, CustomStringConvertible {
    var port: UInt16
    var detail: String
    var description: String { "--http-port \(port): cannot listen (\(detail))" }
}
