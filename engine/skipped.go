package engine

import (
	"go.uber.org/zap"

	"github.com/lchat/lchat-caddy/spacestore"
)

// noteSkipped warns about and counts the files a checkpoint left out of a space's state
// because they are not regular files (spacestore.SkippedFile): the checkpoint itself went on.
func (e *Engine) noteSkipped(in *inst, skipped []spacestore.SkippedFile) {
	if len(skipped) == 0 {
		return
	}
	e.c.skippedFiles.Add(uint64(len(skipped)))
	const show = 10
	paths := make([]string, 0, min(len(skipped), show))
	for _, s := range skipped[:min(len(skipped), show)] {
		paths = append(paths, s.Kind+" "+s.Path)
	}
	in.logger().Warn("checkpoint skipped files that are not regular files",
		zap.Int("count", len(skipped)), zap.Strings("files", paths))
}
