package route53

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	r53 "github.com/aws/aws-sdk-go-v2/service/route53"
	r53types "github.com/aws/aws-sdk-go-v2/service/route53/types"
	"github.com/libdns/libdns"
)

// setExists reports whether err is Route53 refusing to CREATE a record set that
// already exists.
func setExists(err error) bool {
	var icb *r53types.InvalidChangeBatch
	if !errors.As(err, &icb) {
		return false
	}
	for _, m := range icb.Messages {
		if strings.Contains(m, "already exists") {
			return true
		}
	}
	return false
}

// addToSet adds rec's value to the record set of its name and type, keeping the
// values already there. The change batch deletes the set exactly as read and
// creates it with the value added; Route53 applies both or neither, so a set
// changed since the read fails the batch (the delete no longer matches) and the
// read is repeated.
func (p *Provider) addToSet(ctx context.Context, zone string, rec libdns.Record) error {
	rr := rec.RR()
	zoneID, err := p.zoneID(ctx, zone)
	if err != nil {
		return err
	}
	name := libdns.AbsoluteName(rr.Name, zone)
	value := recordValue(rr)
	for attempt := 1; ; attempt++ {
		cur, err := p.recordSet(ctx, zoneID, name, rr.Type)
		if err != nil {
			return err
		}
		merged := []r53types.ResourceRecord{{Value: aws.String(value)}}
		var changes []r53types.Change
		if cur != nil {
			for _, v := range cur.ResourceRecords {
				if aws.ToString(v.Value) == value {
					return nil // already there
				}
			}
			merged = slices.Concat(cur.ResourceRecords, merged)
			changes = append(changes, r53types.Change{Action: r53types.ChangeActionDelete, ResourceRecordSet: cur})
		}
		changes = append(changes, r53types.Change{Action: r53types.ChangeActionCreate, ResourceRecordSet: &r53types.ResourceRecordSet{
			Name:            aws.String(name),
			Type:            r53types.RRType(rr.Type),
			TTL:             aws.Int64(int64(rr.TTL.Seconds())),
			ResourceRecords: merged,
		}})
		out, err := p.client.ChangeResourceRecordSets(ctx, &r53.ChangeResourceRecordSetsInput{
			HostedZoneId: aws.String(zoneID),
			ChangeBatch:  &r53types.ChangeBatch{Changes: changes},
		})
		if err != nil {
			var icb *r53types.InvalidChangeBatch
			if attempt < 3 && errors.As(err, &icb) {
				continue // the set changed under us
			}
			return err
		}
		if p.WaitForSync && out.ChangeInfo != nil {
			w := r53.NewResourceRecordSetsChangedWaiter(p.client)
			return w.Wait(ctx, &r53.GetChangeInput{Id: out.ChangeInfo.Id}, time.Duration(p.MaxWait))
		}
		return nil
	}
}

// zoneID returns the hosted zone to change: the configured one, else the public
// zone named zone.
func (p *Provider) zoneID(ctx context.Context, zone string) (string, error) {
	if p.HostedZoneID != "" {
		return "/hostedzone/" + p.HostedZoneID, nil
	}
	fqdn := strings.ToLower(strings.TrimSuffix(zone, ".") + ".")
	out, err := p.client.ListHostedZonesByName(ctx, &r53.ListHostedZonesByNameInput{DNSName: aws.String(fqdn), MaxItems: aws.Int32(10)})
	if err != nil {
		return "", err
	}
	var private string
	for _, z := range out.HostedZones {
		if strings.ToLower(aws.ToString(z.Name)) != fqdn {
			continue
		}
		if z.Config == nil || !z.Config.PrivateZone {
			return aws.ToString(z.Id), nil
		}
		private = aws.ToString(z.Id)
	}
	if private != "" {
		return private, nil
	}
	return "", fmt.Errorf("HostedZoneNotFound: no hosted zone named %s", fqdn)
}

// recordSet returns the record set of name and type, or nil when there is none.
func (p *Provider) recordSet(ctx context.Context, zoneID, name, typ string) (*r53types.ResourceRecordSet, error) {
	out, err := p.client.ListResourceRecordSets(ctx, &r53.ListResourceRecordSetsInput{
		HostedZoneId:    aws.String(zoneID),
		StartRecordName: aws.String(name),
		StartRecordType: r53types.RRType(typ),
		MaxItems:        aws.Int32(1),
	})
	if err != nil {
		return nil, err
	}
	for _, s := range out.ResourceRecordSets {
		if sameName(aws.ToString(s.Name), name) && string(s.Type) == typ && s.SetIdentifier == nil {
			return &s, nil
		}
	}
	return nil, nil
}

// sameName compares DNS names the way Route53 returns them: lower case, with a
// leading "*" as the octal escape \052.
func sameName(a, b string) bool {
	norm := func(s string) string {
		return strings.ToLower(strings.TrimSuffix(strings.ReplaceAll(s, `\052`, "*"), "."))
	}
	return norm(a) == norm(b)
}

// recordValue is rr's data as Route53 takes it: TXT and SPF values quoted, in
// strings of at most 255 bytes, with the escapes Route53 documents (as the libdns
// provider writes them, so its deletes match).
func recordValue(rr libdns.RR) string {
	if rr.Type != "TXT" && rr.Type != "SPF" {
		return rr.Data
	}
	var parts []string
	for s := rr.Data; ; {
		n := min(len(s), 255)
		parts = append(parts, quoteTXT(s[:n]))
		if s = s[n:]; s == "" {
			break
		}
	}
	return strings.Join(parts, " ")
}

func quoteTXT(s string) string {
	var sb strings.Builder
	sb.WriteByte('"')
	for i := range len(s) {
		switch c := s[i]; {
		case c < 32 || c >= 127:
			fmt.Fprintf(&sb, `\%03o`, c)
		case c == '"' || c == '\\':
			sb.WriteByte('\\')
			sb.WriteByte(c)
		default:
			sb.WriteByte(c)
		}
	}
	sb.WriteByte('"')
	return sb.String()
}
