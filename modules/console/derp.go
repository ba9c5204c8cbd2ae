package console

import (
	"github.com/caddyserver/caddy/v2"

	"github.com/lchat/lchat-caddy/fleetview"
	"github.com/lchat/lchat-caddy/modules/derpswitch"
)

// derpApp reads the derp_switch app's status for the console's DERP chart.
type derpApp struct{ app *derpswitch.App }

// derpSource returns the config's derp_switch app as a DERPSource, or nil without one.
func derpSource(ctx caddy.Context) fleetview.DERPSource {
	iface, err := ctx.AppIfConfigured("derp_switch")
	if err != nil {
		return nil
	}
	app, ok := iface.(*derpswitch.App)
	if !ok {
		return nil
	}
	return derpApp{app: app}
}

// DERP reads the switcher's status.
func (d derpApp) DERP() (fleetview.DERP, bool) {
	sw := d.app.Switcher()
	if sw == nil {
		return fleetview.DERP{}, false
	}
	st := sw.Status()
	out := fleetview.DERP{Pin: st.Override, PinPending: st.PinPending, State: st.Switch.State,
		Commits: st.PinMBBCommits + st.MBBCommits}
	if st.HomeConnected {
		out.Home = st.HomeRegion
	}
	return out, true
}

// Interface guards
var _ fleetview.DERPSource = derpApp{}
