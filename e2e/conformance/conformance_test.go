// Package conformance runs the official Gateway API conformance suite
// (sigs.k8s.io/gateway-api/conformance v1.7.0; Go 1.27: export GOTOOLCHAIN=go1.27.3) against Switchyard.
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
// The one flag added here, -timeout-scale, stretches the suite's wait timeouts
// for slow machines; it leaves MaxTimeToConsistency (at most 30s for a
// conformant report) and the poll interval alone.
package conformance

import (
	"flag"
	"reflect"
	"testing"
	"time"

	"sigs.k8s.io/gateway-api/conformance"
)

var timeoutScale = flag.Float64("timeout-scale", 1, "multiply the suite's wait timeouts (not MaxTimeToConsistency) by this factor")

func TestConformance(t *testing.T) {
	opts := conformance.DefaultOptions(t)
	if *timeoutScale != 1 {
		tc := reflect.ValueOf(&opts.TimeoutConfig).Elem()
		for i := 0; i < tc.NumField(); i++ {
			name, f := tc.Type().Field(i).Name, tc.Field(i)
			if d, ok := f.Interface().(time.Duration); ok && name != "MaxTimeToConsistency" && name != "DefaultPollInterval" {
				f.SetInt(int64(float64(d) * *timeoutScale))
			}
		}
		t.Logf("timeouts scaled by %v: %+v", *timeoutScale, opts.TimeoutConfig)
	}
	conformance.RunConformanceWithOptions(t, opts)
}
