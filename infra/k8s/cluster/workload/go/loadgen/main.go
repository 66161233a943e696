// The shop's load: GET a URL at a steady rate (open loop: a slow answer does not slow the
// sender, as real customers do not wait for each other), and log each second what came
// back. RATE (requests per second) and TARGET_URL come from the environment, so raising
// the load is `kubectl set env deploy/loadgen RATE=...`.
package main

import (
	"io"
	"log"
	"net/http"
	"os"
	"strconv"
	"sync/atomic"
	"time"
)

func main() {
	log.SetFlags(log.LstdFlags)
	target := os.Getenv("TARGET_URL")
	rate, err := strconv.ParseFloat(os.Getenv("RATE"), 64)
	if target == "" || err != nil || rate <= 0 {
		log.Fatal("set TARGET_URL and RATE (requests per second, > 0)")
	}
	// A connection per request, as many customers make: kube-proxy balances connections,
	// so kept-alive ones would stay on the pods that existed when they opened, and a
	// storefront scaled out under load would get none of it.
	client := &http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{DisableKeepAlives: true},
	}
	var ok, failed, errored, inflight atomic.Int64
	go func() {
		for range time.Tick(time.Second) {
			log.Printf("rate %.1f/s: ok %d, 5xx/4xx %d, errors %d, in flight %d",
				rate, ok.Swap(0), failed.Swap(0), errored.Swap(0), inflight.Load())
		}
	}()
	log.Printf("loadgen: GET %s at %.1f/s", target, rate)
	for range time.Tick(time.Duration(float64(time.Second) / rate)) {
		inflight.Add(1)
		go func() {
			defer inflight.Add(-1)
			response, err := client.Get(target)
			if err != nil {
				errored.Add(1)
				return
			}
			_, _ = io.Copy(io.Discard, response.Body)
			response.Body.Close()
			if response.StatusCode >= 400 {
				failed.Add(1)
			} else {
				ok.Add(1)
			}
		}()
	}
}
