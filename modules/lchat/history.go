package lchat

import (
	"net/http"

	"github.com/lchat/lchat-caddy/adminapi"
	"github.com/lchat/lchat-caddy/spacestore"
)

func (a *adminAPI) history(w http.ResponseWriter, r *http.Request, host string) error {
	cps, err := a.app.box.History(r.Context(), host)
	if err != nil {
		return boxErr(err)
	}
	return writeJSON(w, http.StatusOK, adminapi.HistoryResponse{Host: host, Checkpoints: cps})
}

func (a *adminAPI) restore(w http.ResponseWriter, r *http.Request, host string) error {
	var req adminapi.RestoreRequest
	if err := decodeStrict(r, &req); err != nil {
		return err
	}
	target, err := spacestore.ParseTarget(req.At)
	if err != nil {
		return apiErr(http.StatusBadRequest, `"at": %v`, err)
	}
	res, err := a.app.box.Restore(r.Context(), host, target)
	if err != nil {
		return boxErr(err)
	}
	return writeJSON(w, http.StatusOK, res)
}
