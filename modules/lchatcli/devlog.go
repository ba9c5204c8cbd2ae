package lchatcli

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap/buffer"
	"go.uber.org/zap/zapcore"
)

func init() {
	caddy.RegisterModule(DropEncoder{})
}

// exitMessage is what Caddy's core logs at warn on every Ctrl-C (exitProcess in caddy.go),
// under a logger without a name: neither a log's level (the message is at warn, dev's
// default) nor its include/exclude (Caddy's filters cannot name the core's unnamed
// logger alone) can leave it out of dev's logs, so dev's encoder drops it.
const exitMessage = "exiting; byeee!! 👋"

// DropEncoder (caddy.logging.encoders.lchat_drop) encodes every entry with the encoder it
// wraps except those whose message is one of Messages, which it drops. `dev` wraps its
// console or JSON encoder with it to leave out Caddy's exit message (a warning that warns
// of nothing).
type DropEncoder struct {
	// WrappedRaw is the encoder that encodes the entries kept. Required.
	WrappedRaw json.RawMessage `json:"wrap,omitempty" caddy:"namespace=caddy.logging.encoders inline_key=format"`
	// Messages are the messages dropped, matched exactly. Default: none.
	Messages []string `json:"messages,omitempty"`

	zapcore.Encoder `json:"-"`
	drop            map[string]bool
}

// CaddyModule returns the Caddy module information.
func (DropEncoder) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "caddy.logging.encoders.lchat_drop",
		New: func() caddy.Module { return new(DropEncoder) },
	}
}

// Provision loads the wrapped encoder.
func (e *DropEncoder) Provision(ctx caddy.Context) error {
	if e.WrappedRaw == nil {
		return errors.New("wrap: an encoder is required")
	}
	mod, err := ctx.LoadModule(e, "WrappedRaw")
	if err != nil {
		return fmt.Errorf("loading the wrapped encoder: %v", err)
	}
	e.Encoder = mod.(zapcore.Encoder)
	e.drop = make(map[string]bool, len(e.Messages))
	for _, m := range e.Messages {
		e.drop[m] = true
	}
	return nil
}

// Clone clones the wrapped encoder (a logger's With fields go into the clone), keeping
// what is dropped.
func (e DropEncoder) Clone() zapcore.Encoder {
	return DropEncoder{Encoder: e.Encoder.Clone(), drop: e.drop}
}

// dropped is the empty buffer a dropped entry encodes to: the core writes nothing.
var dropped = buffer.NewPool()

// EncodeEntry encodes ent with the wrapped encoder unless its message is dropped.
func (e DropEncoder) EncodeEntry(ent zapcore.Entry, fields []zapcore.Field) (*buffer.Buffer, error) {
	if e.drop[ent.Message] {
		return dropped.Get(), nil
	}
	return e.Encoder.EncodeEntry(ent, fields)
}

// Interface guards
var (
	_ zapcore.Encoder   = (*DropEncoder)(nil)
	_ caddy.Provisioner = (*DropEncoder)(nil)
)
