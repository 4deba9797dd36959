package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/klog/v2"
	"k8s.io/metrics/pkg/apis/custom_metrics"

	"sigs.k8s.io/custom-metrics-apiserver/pkg/provider"
	"sigs.k8s.io/custom-metrics-apiserver/pkg/provider/helpers"
)

var (
	pods = schema.GroupResource{Resource: "pods"}
	// Nothing but a name goes into PromQL unquoted.
	metricName = regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*$`)
	labelName  = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)
)

// podLister names the pods of a namespace that a selector matches.
type podLister interface {
	names(ctx context.Context, namespace string, selector labels.Selector, info provider.CustomMetricInfo) ([]string, error)
}

// dynamicPods lists them in the cluster's API server.
type dynamicPods struct {
	client dynamic.Interface
	mapper apimeta.RESTMapper
}

func (d dynamicPods) names(_ context.Context, namespace string, selector labels.Selector, info provider.CustomMetricInfo) ([]string, error) {
	return helpers.ListObjectNames(d.mapper, d.client, namespace, selector, info)
}

// promProvider is a provider.CustomMetricsProvider for pods only.
type promProvider struct {
	prometheus string
	http       *http.Client
	pods       podLister
	// fixed: names is the allowlist (--metric); else what Prometheus last listed.
	fixed bool

	mu    sync.RWMutex
	names []string
}

var _ provider.CustomMetricsProvider = (*promProvider)(nil)

// ListAllMetrics feeds discovery only: the routes serve any name the Get methods accept.
func (p *promProvider) ListAllMetrics() []provider.CustomMetricInfo {
	p.mu.RLock()
	defer p.mu.RUnlock()
	infos := make([]provider.CustomMetricInfo, 0, len(p.names))
	for _, name := range p.names {
		infos = append(infos, provider.CustomMetricInfo{GroupResource: pods, Namespaced: true, Metric: name})
	}
	return infos
}

func (p *promProvider) GetMetricByName(ctx context.Context, name types.NamespacedName, info provider.CustomMetricInfo, metricSelector labels.Selector) (*custom_metrics.MetricValue, error) {
	values, err := p.query(ctx, name.Namespace, []string{name.Name}, info, metricSelector)
	if err != nil {
		return nil, err
	}
	value, ok := values[name.Name]
	if !ok {
		return nil, provider.NewMetricNotFoundForSelectorError(info.GroupResource, info.Metric, name.Name, metricSelector)
	}
	return metricValue(name, info, metricSelector, value), nil
}

func (p *promProvider) GetMetricBySelector(ctx context.Context, namespace string, selector labels.Selector, info provider.CustomMetricInfo, metricSelector labels.Selector) (*custom_metrics.MetricValueList, error) {
	if !p.serves(namespace, info) {
		return nil, provider.NewMetricNotFoundError(info.GroupResource, info.Metric)
	}
	// Only the selected pods: the HPA averages over every item it is given.
	names, err := p.pods.names(ctx, namespace, selector, info)
	if err != nil {
		return nil, err
	}
	list := &custom_metrics.MetricValueList{Items: []custom_metrics.MetricValue{}}
	if len(names) == 0 {
		return list, nil
	}
	values, err := p.query(ctx, namespace, names, info, metricSelector)
	if err != nil {
		return nil, err
	}
	// A pod without a sample (not scraped yet) is left out: the HPA counts it as missing.
	for _, pod := range names {
		if value, ok := values[pod]; ok {
			list.Items = append(list.Items, *metricValue(types.NamespacedName{Namespace: namespace, Name: pod}, info, metricSelector, value))
		}
	}
	return list, nil
}

type sample struct {
	at    time.Time
	value float64
}

// promQL is prometheus-adapter's default metricsQuery for pods,
// sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>): a pod's series summed (several
// containers may export the metric).
func promQL(metric, namespace string, podNames []string, metricSelector labels.Selector) (string, error) {
	extra, err := promMatchers(metricSelector)
	if err != nil {
		return "", err
	}
	quoted := make([]string, len(podNames))
	for i, n := range podNames {
		quoted[i] = regexp.QuoteMeta(n)
	}
	return fmt.Sprintf(`sum by (pod) (%s{namespace=%q,pod=~%q%s})`, metric, namespace, strings.Join(quoted, "|"), extra), nil
}

// query: each named pod's value now (its latest sample within Prometheus' lookback).
func (p *promProvider) query(ctx context.Context, namespace string, podNames []string, info provider.CustomMetricInfo, metricSelector labels.Selector) (map[string]sample, error) {
	if !p.serves(namespace, info) {
		return nil, provider.NewMetricNotFoundError(info.GroupResource, info.Metric)
	}
	promql, err := promQL(info.Metric, namespace, podNames, metricSelector)
	if err != nil {
		return nil, err
	}
	var data struct {
		Result []struct {
			Metric map[string]string `json:"metric"`
			// [unix seconds of the evaluation (a number), value (a string)]
			Value [2]any `json:"value"`
		} `json:"result"`
	}
	// POST: the pods' names make a long query.
	if err := p.call(ctx, http.MethodPost, "/api/v1/query", url.Values{"query": {promql}}, &data); err != nil {
		return nil, err
	}
	out := make(map[string]sample, len(data.Result))
	for _, r := range data.Result {
		seconds, _ := r.Value[0].(float64)
		text, _ := r.Value[1].(string)
		v, err := strconv.ParseFloat(text, 64)
		if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
			continue
		}
		sec, frac := math.Modf(seconds)
		out[r.Metric["pod"]] = sample{at: time.Unix(int64(sec), int64(frac*1e9)), value: v}
	}
	return out, nil
}

func metricValue(name types.NamespacedName, info provider.CustomMetricInfo, metricSelector labels.Selector, s sample) *custom_metrics.MetricValue {
	m := &custom_metrics.MetricValue{
		DescribedObject: custom_metrics.ObjectReference{APIVersion: "v1", Kind: "Pod", Namespace: name.Namespace, Name: name.Name},
		Metric:          custom_metrics.MetricIdentifier{Name: info.Metric},
		Timestamp:       metav1.NewTime(s.at),
		Value:           *resource.NewMilliQuantity(int64(math.Round(s.value*1000)), resource.DecimalSI),
	}
	if !metricSelector.Empty() {
		if sel, err := metav1.ParseToLabelSelector(metricSelector.String()); err == nil {
			m.Metric.Selector = sel
		}
	}
	return m
}

// promMatchers turns an HPA's metric.selector into PromQL label matchers (`,a="b"...`).
func promMatchers(sel labels.Selector) (string, error) {
	reqs, selectable := sel.Requirements()
	if !selectable {
		return "", fmt.Errorf("metric selector %q selects nothing", sel)
	}
	var b strings.Builder
	for _, r := range reqs {
		if !labelName.MatchString(r.Key()) {
			return "", fmt.Errorf("metric selector key %q is not a Prometheus label name (letters, digits and underscores)", r.Key())
		}
		values := r.Values().List()
		alternatives := make([]string, len(values))
		for i, v := range values {
			alternatives[i] = regexp.QuoteMeta(v)
		}
		var op, value string
		switch r.Operator() {
		case selection.Equals, selection.DoubleEquals:
			op, value = "=", values[0]
		case selection.NotEquals:
			op, value = "!=", values[0]
		case selection.In:
			op, value = "=~", strings.Join(alternatives, "|")
		case selection.NotIn:
			op, value = "!~", strings.Join(alternatives, "|")
		case selection.Exists:
			op = "!="
		case selection.DoesNotExist:
			op = "="
		default:
			return "", fmt.Errorf("metric selector operator %q has no PromQL matcher", r.Operator())
		}
		fmt.Fprintf(&b, ",%s%s%q", r.Key(), op, value)
	}
	return b.String(), nil
}

// serves: a namespaced pods metric whose name is a metric's, on the allowlist if there is one.
func (p *promProvider) serves(namespace string, info provider.CustomMetricInfo) bool {
	if info.GroupResource != pods || namespace == "" || !metricName.MatchString(info.Metric) {
		return false
	}
	if !p.fixed {
		return true
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	for _, n := range p.names {
		if n == info.Metric {
			return true
		}
	}
	return false
}

// relistNames reads the metric names that have pod series (for discovery only).
func (p *promProvider) relistNames(ctx context.Context) {
	var names []string
	err := p.call(ctx, http.MethodGet, "/api/v1/label/__name__/values", url.Values{"match[]": {`{namespace!="",pod!=""}`}}, &names)
	if err != nil {
		klog.ErrorS(err, "listing metric names")
		return
	}
	p.mu.Lock()
	p.names = names
	p.mu.Unlock()
}

// call calls Prometheus' HTTP API and decodes its "data" into out. POST carries the
// parameters as a form, GET in the URL.
func (p *promProvider) call(ctx context.Context, method, path string, params url.Values, out any) error {
	target, body := p.prometheus+path+"?"+params.Encode(), io.Reader(nil)
	if method == http.MethodPost {
		target, body = p.prometheus+path, strings.NewReader(params.Encode())
	}
	req, err := http.NewRequestWithContext(ctx, method, target, body)
	if err != nil {
		return err
	}
	if method == http.MethodPost {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	resp, err := p.http.Do(req)
	if err != nil {
		return fmt.Errorf("prometheus: %w", err)
	}
	defer resp.Body.Close()
	var envelope struct {
		Status    string          `json:"status"`
		Data      json.RawMessage `json:"data"`
		ErrorType string          `json:"errorType"`
		Error     string          `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&envelope); err != nil {
		return fmt.Errorf("prometheus %s: HTTP %d: %w", path, resp.StatusCode, err)
	}
	if envelope.Status != "success" {
		return fmt.Errorf("prometheus %s: %s: %s", path, envelope.ErrorType, envelope.Error)
	}
	return json.Unmarshal(envelope.Data, out)
}
