// Package conformance runs the official Gateway API conformance suite
// (sigs.k8s.io/gateway-api/conformance v1.5.1) against Switchyard.
//
// Build once, run later against a cluster (kubeconfig from KUBECONFIG, or -kubeconfig):
//
//	go test -c -o gwapi-conformance.test .
//	./gwapi-conformance.test -test.run TestConformance -test.v -test.timeout 2h \
//	    -gateway-class=switchyard -conformance-profiles=GATEWAY-HTTP \
//	    -supported-features=Gateway,HTTPRoute,ReferenceGrant \
//	    -report-output=report.yaml -organization=... -project=switchyard \
//	    -url=... -version=... -contact=...
//
// All suite flags are the standard ones of
// sigs.k8s.io/gateway-api/conformance/utils/flags, parsed by conformance.DefaultOptions.
package conformance

import (
	"testing"

	"sigs.k8s.io/gateway-api/conformance"
)

func TestConformance(t *testing.T) {
	opts := conformance.DefaultOptions(t)
	conformance.RunConformanceWithOptions(t, opts)
}
