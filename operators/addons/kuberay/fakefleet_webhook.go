// Added by fakefleet to KubeRay's main package when it builds it; upstream's main.go is
// unchanged (operators/addons/kuberay/__init__.py says why).
//
// Upstream runs the operator in a pod of its own, where the webhook server's fixed port 9443 on
// every interface is the pod's. fakefleet runs one operator per member cluster on one host, so
// the webhook server takes the address and certificate directory these flags name, and
// /readyz answers only once it accepts connections (the member's webhook configuration is
// applied then, never before).
package main

import (
	"flag"

	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
)

func init() {
	host := flag.String("webhook-host", "", "The address the webhook server binds to (added by fakefleet).")
	port := flag.Int("webhook-port", webhook.DefaultPort, "The port the webhook server listens on (added by fakefleet).")
	certDir := flag.String("webhook-cert-dir", "", "The directory of the webhook server's tls.crt and tls.key (added by fakefleet).")
	newManager := ctrl.NewManager
	ctrl.NewManager = func(config *rest.Config, options ctrl.Options) (ctrl.Manager, error) {
		options.WebhookServer = webhook.NewServer(webhook.Options{Host: *host, Port: *port, CertDir: *certDir})
		manager, err := newManager(config, options)
		if err != nil {
			return nil, err
		}
		return manager, manager.AddReadyzCheck("webhook", manager.GetWebhookServer().StartedChecker())
	}
}
