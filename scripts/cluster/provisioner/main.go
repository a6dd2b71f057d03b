// The dev cluster's default StorageClass ("standard"): every claim of that class gets a volume of
// its own, a directory on the node's disk under -root, bound to it at once (ReadWriteOnce and
// ReadWriteMany alike: there is one node), as kind's and minikube's default classes do. When the
// claim is deleted the directory and the volume go with it (reclaim policy Delete).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
)

const (
	className     = "standard"
	provisionedBy = "trainctl.dev/hostpath"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "the cluster's kubeconfig")
	root := flag.String("root", "", "the directory the volumes are made in")
	flag.Parse()
	if *kubeconfig == "" || *root == "" {
		fmt.Fprintln(os.Stderr, "usage: provisioner -kubeconfig FILE -root DIR")
		os.Exit(2)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		klog.Fatalf("%s: %v", *kubeconfig, err)
	}
	cfg.Timeout = 10 * time.Second
	client := kubernetes.NewForConfigOrDie(cfg)
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	klog.Infof("provisioning class %q under %s", className, *root)
	for ctx.Err() == nil {
		if err := pass(ctx, client, *root); err != nil {
			klog.Warningf("%v", err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// pass makes a volume for each pending claim of the class and removes each released volume.
func pass(ctx context.Context, client kubernetes.Interface, root string) error {
	claims, err := client.CoreV1().PersistentVolumeClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing claims: %w", err)
	}
	for i := range claims.Items {
		c := &claims.Items[i]
		if c.Spec.StorageClassName == nil || *c.Spec.StorageClassName != className || c.Spec.VolumeName != "" ||
			c.Status.Phase != corev1.ClaimPending || c.DeletionTimestamp != nil {
			continue
		}
		if err := provision(ctx, client, root, c); err != nil {
			klog.Warningf("claim %s/%s: %v", c.Namespace, c.Name, err)
		}
	}
	volumes, err := client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing volumes: %w", err)
	}
	for i := range volumes.Items {
		v := &volumes.Items[i]
		if v.Annotations["pv.kubernetes.io/provisioned-by"] != provisionedBy || v.Status.Phase != corev1.VolumeReleased {
			continue
		}
		if err := os.RemoveAll(filepath.Join(root, v.Name)); err != nil {
			klog.Warningf("volume %s: %v", v.Name, err)
			continue
		}
		if err := client.CoreV1().PersistentVolumes().Delete(ctx, v.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			klog.Warningf("volume %s: %v", v.Name, err)
		} else {
			klog.Infof("deleted volume %s", v.Name)
		}
	}
	return nil
}

func provision(ctx context.Context, client kubernetes.Interface, root string, c *corev1.PersistentVolumeClaim) error {
	name := "pvc-" + string(c.UID)
	dir := filepath.Join(root, name)
	// Pods run as any user (the restricted profile's non-root ones among them): the directory is
	// theirs to write, as local-path-provisioner's are.
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return err
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		return err
	}
	size, ok := c.Spec.Resources.Requests[corev1.ResourceStorage]
	if !ok {
		return fmt.Errorf("it requests no storage")
	}
	hostPathType := corev1.HostPathDirectory
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{"pv.kubernetes.io/provisioned-by": provisionedBy}},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: size},
			AccessModes:                   c.Spec.AccessModes,
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			StorageClassName:              className,
			VolumeMode:                    c.Spec.VolumeMode,
			ClaimRef: &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1",
				Namespace: c.Namespace, Name: c.Name, UID: c.UID},
			PersistentVolumeSource: corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dir, Type: &hostPathType}},
		},
	}
	if _, err := client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	klog.Infof("claim %s/%s: volume %s at %s", c.Namespace, c.Name, name, dir)
	return nil
}
