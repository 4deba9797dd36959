// Command custom-metrics-adapter serves custom.metrics.k8s.io for pods from Prometheus, as
// prometheus-adapter does, on the same library (sigs.k8s.io/custom-metrics-apiserver):
//
//	GET /apis/custom.metrics.k8s.io/v1beta2/namespaces/NS/pods/*/METRIC?labelSelector=SEL
//
// lists the pods matching SEL in the cluster's API server and answers, for each pod Prometheus
// has a sample of, sum by (pod) (METRIC{namespace="NS",pod=~"<the pods>"}) at the time of the
// request. fakefleet runs it per member cluster on a loopback port, behind the member's
// aggregation layer, with delegated authentication and authorization (its flags are the
// library's: --secure-port, --tls-cert-file, --authentication-kubeconfig, ...).
package main

import (
	"net/http"
	"os"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/component-base/logs"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/klog/v2"

	"sigs.k8s.io/custom-metrics-apiserver/pkg/apiserver/metrics"
	basecmd "sigs.k8s.io/custom-metrics-apiserver/pkg/cmd"
)

type adapter struct {
	basecmd.AdapterBase
	prometheus string
	metrics    []string
	relist     time.Duration
}

func main() {
	logs.InitLogs()
	defer logs.FlushLogs()

	a := &adapter{}
	a.Name = "custom-metrics-adapter"
	// The library's flags: secure serving, delegated authn/authz, --lister-kubeconfig, ...
	fs := a.Flags()
	fs.StringVar(&a.prometheus, "prometheus-url", "http://127.0.0.1:9090", "Prometheus' HTTP API")
	fs.StringSliceVar(&a.metrics, "metric", nil, "a metric served for pods (repeatable): the only ones served and listed; none: every metric Prometheus has with namespace and pod labels")
	fs.DurationVar(&a.relist, "metrics-relist-interval", 30*time.Second, "how often the metrics listed in discovery are read from Prometheus (without --metric)")
	logs.AddFlags(fs)
	if err := fs.Parse(os.Args[1:]); err != nil {
		klog.Fatalf("parsing flags: %v", err)
	}
	for _, name := range a.metrics {
		if !metricName.MatchString(name) {
			klog.Fatalf("--metric=%s is not a Prometheus metric name", name)
		}
	}

	client, err := a.DynamicClient()
	if err != nil {
		klog.Fatalf("dynamic client: %v", err)
	}
	mapper, err := a.RESTMapper()
	if err != nil {
		klog.Fatalf("REST mapper: %v", err)
	}
	p := &promProvider{
		prometheus: strings.TrimSuffix(a.prometheus, "/"),
		http:       &http.Client{Timeout: 10 * time.Second},
		pods:       dynamicPods{client: client, mapper: mapper},
		fixed:      len(a.metrics) > 0,
		names:      a.metrics,
	}
	ctx := genericapiserver.SetupSignalContext()
	if !p.fixed {
		go wait.UntilWithContext(ctx, p.relistNames, a.relist)
	}
	a.WithCustomMetrics(p)
	if err := metrics.RegisterMetrics(legacyregistry.Register); err != nil {
		klog.Fatalf("registering metrics: %v", err)
	}
	if err := a.Run(ctx); err != nil {
		klog.Fatalf("serving: %v", err)
	}
}
