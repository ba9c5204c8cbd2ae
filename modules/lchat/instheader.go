package lchat

import (
	"net/http"
	"os"

	"github.com/lchat/lchat-caddy/engine"
)

// envTestInstanceHeader, when "1", makes the handler name the instance that answered each
// request in the X-Lchat-Instance response header (box SELF, or "local", then the
// instance's pid and wake time), so a fault campaign (tests/chaos) can check that two
// instances of a space never answer at the same time. Test-only: it tells clients about
// the box's internals.
const envTestInstanceHeader = "LCHAT_TEST_INSTANCE_HEADER"

// InstanceHeader is the response header set under LCHAT_TEST_INSTANCE_HEADER=1.
const InstanceHeader = "X-Lchat-Instance"

var testInstanceHeader = os.Getenv(envTestInstanceHeader) == "1"

// setInstanceHeader names u's instance on the response, when the test hook is on.
func (h *Handler) setInstanceHeader(w http.ResponseWriter, u *engine.Use) {
	if !testInstanceHeader {
		return
	}
	w.Header().Set(InstanceHeader, h.app.box.Self()+" "+u.Instance())
}
