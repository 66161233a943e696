// The test cluster's own workload: one static binary that serves HTTP (and logs every
// request to stdout, so `kubectl logs` has something to read) or fetches a URL (so a
// second pod can prove Service DNS and the Service's virtual IP work).
//
//	probe serve [-port 8080]
//	probe get URL [-tries 30]
package main

import (
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

func serve(args []string) {
	flags := flag.NewFlagSet("serve", flag.ExitOnError)
	port := flags.Int("port", 8080, "port to listen on")
	_ = flags.Parse(args)
	host, _ := os.Hostname()
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Printf("served %s %s for %s\n", r.Method, r.URL.Path, r.RemoteAddr)
		fmt.Fprintf(w, "hello from %s\n", host)
	})
	fmt.Printf("probe listening on :%d as %s\n", *port, host)
	server := &http.Server{Addr: fmt.Sprintf(":%d", *port), ReadHeaderTimeout: 5 * time.Second}
	if err := server.ListenAndServe(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func get(args []string) {
	flags := flag.NewFlagSet("get", flag.ExitOnError)
	tries := flags.Int("tries", 1, "attempts, one second apart")
	_ = flags.Parse(args)
	if flags.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: probe get [-tries N] URL")
		os.Exit(2)
	}
	client := &http.Client{Timeout: 3 * time.Second}
	var last error
	for i := 0; i < *tries; i++ {
		if i > 0 {
			time.Sleep(time.Second)
		}
		resp, err := client.Get(flags.Arg(0))
		if err != nil {
			last = err
			continue
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			last = fmt.Errorf("status %d: %v", resp.StatusCode, err)
			continue
		}
		fmt.Print(string(body))
		return
	}
	fmt.Fprintln(os.Stderr, last)
	os.Exit(1)
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: probe serve|get ...")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "serve":
		serve(os.Args[2:])
	case "get":
		get(os.Args[2:])
	default:
		fmt.Fprintln(os.Stderr, "unknown command", os.Args[1])
		os.Exit(2)
	}
}
