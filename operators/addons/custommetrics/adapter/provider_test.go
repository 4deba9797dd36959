package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"sigs.k8s.io/custom-metrics-apiserver/pkg/provider"
)

type listed []string

func (l listed) names(context.Context, string, labels.Selector, provider.CustomMetricInfo) ([]string, error) {
	return l, nil
}

// fakePrometheus answers /api/v1/query with a sample per pod in values, and records the query.
func fakePrometheus(t *testing.T, values map[string]string, queries *[]string) *httptest.Server {
	t.Helper()
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v1/query" || r.Method != http.MethodPost {
			t.Errorf("unexpected %s %s", r.Method, r.URL.Path)
		}
		*queries = append(*queries, r.FormValue("query"))
		result := []map[string]any{}
		for pod, value := range values {
			result = append(result, map[string]any{"metric": map[string]string{"pod": pod}, "value": []any{1.8e9, value}})
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"status": "success", "data": map[string]any{"resultType": "vector", "result": result}})
	}))
}

var waiting = provider.CustomMetricInfo{GroupResource: pods, Namespaced: true, Metric: "vllm_num_requests_waiting"}

func TestSelectedPodsWithASampleAreAnsweredInMilliUnits(t *testing.T) {
	var queries []string
	server := fakePrometheus(t, map[string]string{"vllm-a": "30", "vllm-b": "2.5", "other": "7"}, &queries)
	defer server.Close()
	p := &promProvider{prometheus: server.URL, http: server.Client(), pods: listed{"vllm-a", "vllm-b", "vllm-c"}}
	list, err := p.GetMetricBySelector(context.Background(), "serving", labels.Everything(), waiting, labels.Everything())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, item := range list.Items {
		got[item.DescribedObject.Name] = item.Value.MilliValue()
		if item.DescribedObject.Kind != "Pod" || item.DescribedObject.Namespace != "serving" {
			t.Errorf("described %+v", item.DescribedObject)
		}
	}
	if len(got) != 2 || got["vllm-a"] != 30000 || got["vllm-b"] != 2500 {
		t.Errorf("values %v: want vllm-a 30, vllm-b 2.5, and neither vllm-c (no sample) nor other (not selected)", got)
	}
	want := `sum by (pod) (vllm_num_requests_waiting{namespace="serving",pod=~"vllm-a|vllm-b|vllm-c"})`
	if len(queries) != 1 || queries[0] != want {
		t.Errorf("queries %q, want %q", queries, want)
	}
}

func TestOnePodByName(t *testing.T) {
	var queries []string
	server := fakePrometheus(t, map[string]string{"vllm-a": "4"}, &queries)
	defer server.Close()
	p := &promProvider{prometheus: server.URL, http: server.Client(), pods: listed{}}
	value, err := p.GetMetricByName(context.Background(), types.NamespacedName{Namespace: "serving", Name: "vllm-a"}, waiting, labels.Everything())
	if err != nil || value.Value.MilliValue() != 4000 {
		t.Fatalf("value %v, error %v", value, err)
	}
	if _, err := p.GetMetricByName(context.Background(), types.NamespacedName{Namespace: "serving", Name: "vllm-z"}, waiting, labels.Everything()); err == nil {
		t.Error("a pod without a sample is not found")
	}
}

func TestOnlyNamespacedPodMetricsOnTheAllowlistAreServed(t *testing.T) {
	p := &promProvider{fixed: true, names: []string{"vllm_num_requests_waiting"}}
	nodes := provider.CustomMetricInfo{GroupResource: pods, Metric: "vllm_num_requests_waiting"}
	nodes.GroupResource.Resource = "nodes"
	other := waiting
	other.Metric = "other"
	injected := waiting
	injected.Metric = `up{job="x"}`
	for _, info := range []provider.CustomMetricInfo{nodes, other, injected} {
		if p.serves("serving", info) {
			t.Errorf("%+v served", info)
		}
	}
	if p.serves("", waiting) {
		t.Error("a root-scoped request served")
	}
	if !p.serves("serving", waiting) {
		t.Error("the allowed metric not served")
	}
	if (&promProvider{}).serves("serving", injected) {
		t.Error("a name that is not a metric's goes into PromQL")
	}
}

func TestMetricSelectorsBecomeMatchers(t *testing.T) {
	for selector, want := range map[string]string{
		"":                        "",
		"model=llama":             `,model="llama"`,
		"model!=llama":            `,model!="llama"`,
		"model in (a.b,c)":        `,model=~"a\\.b|c"`,
		"model notin (a)":         `,model!~"a"`,
		"model":                   `,model!=""`,
		"!model":                  `,model=""`,
		"model=llama,queue=first": `,model="llama",queue="first"`,
	} {
		parsed, err := labels.Parse(selector)
		if err != nil {
			t.Fatal(err)
		}
		got, err := promMatchers(parsed)
		if err != nil || got != want {
			t.Errorf("%q: got %q (%v), want %q", selector, got, err, want)
		}
	}
	for _, selector := range []string{"app.kubernetes.io/name=x", "size>3"} {
		parsed, err := labels.Parse(selector)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := promMatchers(parsed); err == nil {
			t.Errorf("%q: got %q, want an error", selector, got)
		} else if !strings.Contains(err.Error(), "metric selector") {
			t.Errorf("%q: %v", selector, err)
		}
	}
}
