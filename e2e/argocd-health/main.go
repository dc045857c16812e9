// Runs Switchyard's Argo CD health check (docs/argocd/health.lua) through Argo CD's own
// Lua health code (github.com/argoproj/argo-cd/v2/util/lua), on every case of a test file
// in Argo CD's resource-customization format. Built by e2e/provision.sh (tool
// argocd-health); run by e2e/tests/argocd_health.rs.
//
// Usage: argocd-health HEALTH_LUA HEALTH_TEST_YAML
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/argoproj/argo-cd/v2/util/lua"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

type testFile struct {
	Tests []struct {
		HealthStatus struct {
			Status  string `json:"status"`
			Message string `json:"message"`
		} `json:"healthStatus"`
		InputPath string `json:"inputPath"`
	} `json:"tests"`
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: argocd-health HEALTH_LUA HEALTH_TEST_YAML")
		os.Exit(2)
	}
	script, err := os.ReadFile(os.Args[1])
	check(err)
	raw, err := os.ReadFile(os.Args[2])
	check(err)
	var tests testFile
	check(yaml.Unmarshal(raw, &tests))
	if len(tests.Tests) == 0 {
		fail("no test in %s", os.Args[2])
	}
	failed := 0
	for _, t := range tests.Tests {
		input, err := os.ReadFile(filepath.Join(filepath.Dir(os.Args[2]), t.InputPath))
		check(err)
		obj := &unstructured.Unstructured{}
		check(yaml.Unmarshal(input, &obj.Object))
		// Argo CD's own interpreter, as its controller runs a health script.
		hs, err := lua.VM{}.ExecuteHealthLua(obj, string(script))
		if err != nil {
			fmt.Printf("FAIL %s: %v\n", t.InputPath, err)
			failed++
			continue
		}
		if string(hs.Status) != t.HealthStatus.Status || hs.Message != t.HealthStatus.Message {
			fmt.Printf("FAIL %s: got %s %q, want %s %q\n", t.InputPath, hs.Status, hs.Message,
				t.HealthStatus.Status, t.HealthStatus.Message)
			failed++
			continue
		}
		fmt.Printf("ok   %s: %s %q\n", t.InputPath, hs.Status, hs.Message)
	}
	if failed > 0 {
		fail("%d of %d cases failed", failed, len(tests.Tests))
	}
}

func check(err error) {
	if err != nil {
		fail("%v", err)
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "argocd-health: "+format+"\n", args...)
	os.Exit(1)
}
