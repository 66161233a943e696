// The test cluster's shop: one binary, three services (storefront -> checkout -> payments),
// each run as its own Deployment with `-role`. Its version is stamped at build time
// (-ldflags "-X main.version=..."), so a bad release is a different image, rolled out the
// way production rolls one out, not a flag flipped in a running pod:
//
//	v1         healthy
//	v2-slow    adds 400 ms to every business request
//	v2-errors  answers 500 to every business request (probes still pass, so it rolls out)
//	v2-crash   exits at start, as a release with a bad configuration does (CrashLoopBackOff)
//
// What an operator can change without a release (environment, so `kubectl set env`):
//
//	UPSTREAM_URL          the dependency this role calls (storefront: checkout; checkout: payments)
//	WORKERS, WORK_MS      capacity: requests served at once, and how long each holds a worker;
//	                      beyond WORKERS*1000/WORK_MS per second requests queue (scaling helps)
//	RESPONSE_DELAY_MS     extra time before answering (a slow dependency's configuration)
//	LEAK_MB_PER_SECOND    keep memory it never frees until the container's limit kills it
//
// Metrics follow the OpenTelemetry HTTP semantic conventions (otelhttp's server and client
// request-duration histograms), exported for Prometheus at /metrics with service.name and
// deployment.environment.name promoted from the resource to labels of every series.
package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
)

// version is the release, stamped by the build.
var version = "dev"

func envInt(name string, fallback int) int {
	if value, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return value
	}
	return fallback
}

// meterProvider exports to a registry of its own; service.name, service.version and
// deployment.environment.name come from OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES
// (set by the Deployment) on top of the role and the stamped version.
func meterProvider(role string) (*sdkmetric.MeterProvider, *prometheus.Registry, error) {
	res, err := resource.New(context.Background(),
		resource.WithAttributes(semconv.ServiceName(role), semconv.ServiceVersion(version)),
		resource.WithFromEnv(),
	)
	if err != nil {
		return nil, nil, err
	}
	registry := prometheus.NewRegistry()
	exporter, err := otelprom.New(
		otelprom.WithRegisterer(registry),
		otelprom.WithResourceAsConstantLabels(attribute.NewAllowKeysFilter(
			semconv.ServiceNameKey, semconv.DeploymentEnvironmentNameKey,
		)),
	)
	if err != nil {
		return nil, nil, err
	}
	return sdkmetric.NewMeterProvider(sdkmetric.WithResource(res), sdkmetric.WithReader(exporter)), registry, nil
}

// leak holds memory it never frees, touching every page so it is resident, until the
// kernel's OOM killer ends the container at its memory limit.
func leak(mbPerSecond int) {
	var kept [][]byte
	for range time.Tick(100 * time.Millisecond) {
		chunk := make([]byte, mbPerSecond<<20/10)
		for i := range chunk {
			chunk[i] = byte(i)
		}
		kept = append(kept, chunk)
		log.Printf("holding %d MiB", len(kept)*mbPerSecond/10)
	}
}

type shop struct {
	role     string
	upstream string
	client   *http.Client
	workers  chan struct{}
	work     time.Duration
	delay    time.Duration
}

// serve is one business request: wait for a worker, do the work, call the dependency.
func (s *shop) serve(w http.ResponseWriter, r *http.Request) {
	select {
	case s.workers <- struct{}{}:
	case <-r.Context().Done():
		http.Error(w, "gave up waiting for a worker", http.StatusServiceUnavailable)
		return
	}
	time.Sleep(s.work)
	<-s.workers
	time.Sleep(s.delay)
	switch version {
	case "v2-slow":
		time.Sleep(400 * time.Millisecond)
	case "v2-errors":
		http.Error(w, "internal error in "+version, http.StatusInternalServerError)
		return
	}
	if s.upstream == "" {
		fmt.Fprintf(w, "%s %s ok\n", s.role, version)
		return
	}
	request, _ := http.NewRequestWithContext(r.Context(), http.MethodPost, s.upstream, nil)
	response, err := s.client.Do(request)
	if err != nil {
		http.Error(w, fmt.Sprintf("%s: %v", s.upstream, err), http.StatusBadGateway)
		return
	}
	body, _ := io.ReadAll(response.Body)
	response.Body.Close()
	if response.StatusCode >= 500 {
		http.Error(w, fmt.Sprintf("%s answered %d", s.upstream, response.StatusCode), http.StatusBadGateway)
		return
	}
	fmt.Fprintf(w, "%s %s ok; %s", s.role, version, body)
}

func main() {
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)
	role := "storefront"
	port := 8080
	for i := 1; i+1 < len(os.Args); i += 2 {
		switch os.Args[i] {
		case "-role":
			role = os.Args[i+1]
		case "-port":
			port, _ = strconv.Atoi(os.Args[i+1])
		}
	}
	if version == "v2-crash" {
		log.Fatalf("%s %s: cannot start: required setting PAYMENTS_API_KEY_FILE is not set", role, version)
	}
	provider, registry, err := meterProvider(role)
	if err != nil {
		log.Fatalf("metrics: %v", err)
	}
	if mb := envInt("LEAK_MB_PER_SECOND", 0); mb > 0 {
		go leak(mb)
	}
	upstream := os.Getenv("UPSTREAM_URL")
	s := &shop{
		role:     role,
		upstream: upstream,
		client: &http.Client{
			Timeout:   5 * time.Second,
			Transport: otelhttp.NewTransport(http.DefaultTransport, otelhttp.WithMeterProvider(provider)),
		},
		workers: make(chan struct{}, max(1, envInt("WORKERS", 4))),
		work:    time.Duration(envInt("WORK_MS", 10)) * time.Millisecond,
		delay:   time.Duration(envInt("RESPONSE_DELAY_MS", 0)) * time.Millisecond,
	}
	business := map[string]string{"storefront": "/buy", "checkout": "/checkout", "payments": "/pay"}[role]
	if business == "" {
		log.Fatalf("unknown role %q: storefront, checkout or payments", role)
	}
	mux := http.NewServeMux()
	mux.Handle(business, otelhttp.NewHandler(http.HandlerFunc(s.serve), role+" "+business,
		otelhttp.WithMeterProvider(provider)))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.Handle("/metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
	server := &http.Server{Addr: fmt.Sprintf(":%d", port), Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		stop := make(chan os.Signal, 1)
		signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
		<-stop
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = server.Shutdown(ctx)
	}()
	log.Printf("%s %s listening on :%d (%s), upstream %q", role, version, port, business, upstream)
	if err := server.ListenAndServe(); err != nil && err != http.ErrServerClosed {
		log.Fatal(err)
	}
}
