// hopclient: sequential requests over kept-alive connections, as client-go sends them (net/http,
// HTTP/2 over TLS, one Transport per target), for scripts/k8s/hop.py.
//
//	hopclient -ca ca.crt -token T -target plain=https://127.0.0.81:16443 -target filter=https://... \
//	    -path get=/api/v1/namespaces/default/configmaps/hop-cm -rounds 20 -n 200 -warmup 20
//
// Every round sends, for each path, n requests to every target: one request to each target in turn,
// the order rotating by one each time (or, with -blocks, n to one target and then the next), so
// machine drift and other jobs' bursts hit all targets alike. Requests never overlap. The first request of each
// target (a new connection: TCP, TLS, HTTP/2 settings) is reported apart. Output: one JSON document
// on stdout: per round, target and path the sorted latencies in microseconds.
package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strings"
	"time"
)

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

type target struct {
	Name   string
	URL    string
	client *http.Client
}

type sample struct {
	Round  int       `json:"round"`
	Target string    `json:"target"`
	Path   string    `json:"path"`
	Us     []float64 `json:"us"`
}

func main() {
	var targets, paths multi
	ca := flag.String("ca", "", "CA bundle (PEM) that verifies every target")
	cert := flag.String("cert", "", "client certificate (PEM), optional")
	key := flag.String("key", "", "client key (PEM), optional")
	token := flag.String("token", "", "bearer token, optional")
	rounds := flag.Int("rounds", 20, "paired rounds")
	n := flag.Int("n", 200, "timed requests per target, path and round")
	warmup := flag.Int("warmup", 50, "untimed requests per target and path before round 0")
	h1 := flag.Bool("http1", false, "HTTP/1.1 instead of HTTP/2")
	blocks := flag.Bool("blocks", false, "per round, n requests to one target, then the next (default: one request to each target in turn, the order rotating)")
	flag.Var(&targets, "target", "name=url[#servername] (repeatable)")
	flag.Var(&paths, "path", "name=/path?query (repeatable)")
	flag.Parse()

	pool := x509.NewCertPool()
	pem, err := os.ReadFile(*ca)
	if err != nil || !pool.AppendCertsFromPEM(pem) {
		fail("cannot read CA %s: %v", *ca, err)
	}
	var certs []tls.Certificate
	if *cert != "" {
		c, err := tls.LoadX509KeyPair(*cert, *key)
		if err != nil {
			fail("client certificate: %v", err)
		}
		certs = []tls.Certificate{c}
	}
	var ts []*target
	for _, t := range targets {
		name, rest, ok := strings.Cut(t, "=")
		if !ok {
			fail("bad -target %q", t)
		}
		url, sni, _ := strings.Cut(rest, "#")
		tr := &http.Transport{
			TLSClientConfig:     &tls.Config{RootCAs: pool, Certificates: certs, ServerName: sni},
			ForceAttemptHTTP2:   !*h1,
			MaxIdleConnsPerHost: 4,
			IdleConnTimeout:     time.Hour,
		}
		if *h1 {
			tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
		}
		ts = append(ts, &target{Name: name, URL: url, client: &http.Client{Transport: tr, Timeout: 30 * time.Second}})
	}
	type path struct{ Name, P string }
	var ps []path
	for _, p := range paths {
		name, v, ok := strings.Cut(p, "=")
		if !ok {
			fail("bad -path %q", p)
		}
		ps = append(ps, path{name, v})
	}
	do := func(t *target, p string) (float64, string) {
		req, _ := http.NewRequest("GET", t.URL+p, nil)
		req.Header.Set("Accept", "application/json")
		req.Header.Set("User-Agent", "hopclient/0 (kube-peer-proxy bench)")
		if *token != "" {
			req.Header.Set("Authorization", "Bearer "+*token)
		}
		s := time.Now()
		r, err := t.client.Do(req)
		if err != nil {
			fail("%s %s: %v", t.Name, p, err)
		}
		_, err = io.Copy(io.Discard, r.Body)
		r.Body.Close()
		d := float64(time.Since(s).Nanoseconds()) / 1000
		if err != nil || r.StatusCode != 200 {
			fail("%s %s: status %d, %v", t.Name, p, r.StatusCode, err)
		}
		return d, r.Proto
	}
	first := map[string]float64{}
	proto := map[string]string{}
	for _, t := range ts {
		for i, p := range ps {
			for j := 0; j < *warmup || j == 0; j++ {
				d, pr := do(t, p.P)
				if i == 0 && j == 0 {
					first[t.Name] = d
					proto[t.Name] = pr
				}
			}
		}
	}
	var out []sample
	for r := 0; r < *rounds; r++ {
		for _, p := range ps {
			us := make([][]float64, len(ts))
			if *blocks {
				for k := range ts {
					t := (k + r) % len(ts)
					for i := 0; i < *n; i++ {
						d, _ := do(ts[t], p.P)
						us[t] = append(us[t], d)
					}
				}
			} else {
				for i := 0; i < *n; i++ {
					for k := range ts {
						t := (k + i + r) % len(ts)
						d, _ := do(ts[t], p.P)
						us[t] = append(us[t], d)
					}
				}
			}
			for t := range ts {
				sort.Float64s(us[t])
				out = append(out, sample{r, ts[t].Name, p.Name, us[t]})
			}
		}
	}
	json.NewEncoder(os.Stdout).Encode(map[string]any{"first_us": first, "proto": proto, "samples": out})
}

func fail(f string, a ...any) {
	fmt.Fprintf(os.Stderr, "hopclient: "+f+"\n", a...)
	os.Exit(1)
}
