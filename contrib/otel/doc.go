// Package umbpotel shows how to trace and measure a handle's calls to the
// server with OpenTelemetry: install otelgrpc's client stats handler with
// umbp.Config.StatsHandler. It is a module of its own, so that the core
// module does not require OpenTelemetry; it exports nothing.
//
//	rt, err := umbp.NewStandaloneRuntime(umbp.Config{
//		Endpoint:     "unix:///run/umbp/standalone/node0.grpc.sock",
//		StatsHandler: otelgrpc.NewClientHandler(), // the global providers
//	})
//
// Every gRPC call of every handle made from rt (lookups, batches,
// registrations, pings) becomes a client span and feeds otelgrpc's RPC
// metrics; the fd handoff is not gRPC and is not traced.
package umbpotel
